"""Recovery: what happens to a run after a failure, or before its time runs out. It relaunches through the
launcher, below the launch API (which calls it) and above the watch (whose verdicts it reads).

restarts.py            relaunch a failed run from the newest checkpoint complete on every node, as another attempt
attempts.py            what a relaunch changes, as plain data: the nodes left, the batch re-split, the checkpoint,
                       whether a failure is worth another attempt
driver.py              who relaunches: the face that launched the run, or an `attach` that takes the role over
checkpoint_request.py  a checkpoint asked of a running job from outside (SIGUSR2), before SLURM's time limit
"""
