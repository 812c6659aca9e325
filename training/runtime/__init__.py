"""The worker as a process, below everything else: what any part of it may use.

errors        InputError (exit 2) and how a failure is reported
dist          process-group set-up and the few collectives the recipe needs
heartbeat     each rank's heartbeat file, read by the monitor
stacks        every thread's stack on SIGUSR1
stop          SIGTERM as a stop at a step boundary, peers that are gone
step_timing   each rank's compute and wait time per step
profiling     --profile_step's one profiled step
metrics       metrics.jsonl
trackers      --report_to's experiment trackers
quiet         library messages kept out of the logs
build_lock    one builder, the others waiting (the tokenized cache, the universal checkpoint)
cachedir      where rebuildable things are kept
"""
