"""The watch on a running job: every read of its nodes, and what the reads add up to. It only looks: it starts,
relaunches and stops nothing (the launcher above it does, on what it says).

monitor.py     the launcher's eyes: each due read of a node off the follower's thread, bounded, and the verdicts
health.py      whether each node can be read, decided over time, never from one failed read
watchdog.py    a hang: no step within a bound derived from the run's own steps, and the rank that holds it
stacks.py      every rank's Python stack (and NCCL's flight recorder) collected when the watchdog calls a hang
stragglers.py  a node that holds every step back, against the other nodes' median
evidence.py    one line of evidence about a node (GPU clocks, CPU load, link; the kernel's hardware faults)
blame.py       which node made a run fail when a machine goes: evidence across nodes, never one node's log
notices.py     what the monitor noticed beyond each node's state, as every face shows it (notices.jsonl)
metrics.py     the worker's metrics.jsonl followed from the master, and its summary for the views
gpumon.py      every node's GPU (or CPU) load, live, for the Run screen
gpuseries.py   the same load handed to the worker's trackers beside the loss (--node_gpu_file)
"""
