"""A run: the launch API every face calls, the launcher that runs a plan on its nodes, and the run directory that
lets any face quit and attach later. Its rooms import down (pyproject.toml's run-rooms contract):
slurm > api > follow > events, recovery, export, tools > launcher, output_guard > culprit > watch > runs > rundir
> states.

api.py           the launch API: connect -> check -> plan -> launch -> follow -> stop, and attach, once for every face
follow.py        the API's last steps: a running job followed look by look to its end, and stopped
events.py        what the API yields, typed, for every face to render
launcher.py      a plan run on its nodes, one detached job each, followed until it ends
culprit.py       which node a failed attempt blames: a cause of its own over a lost peer, a machine gone silent
output_guard.py  before replay or demo: whether node 0's output directory holds another run's checkpoints
runs.py          the runs under a runs root, each as its directory says (state, step, loss, attempts)
rundir.py        one run directory: plan, preset, facts, pids, state, logs, metrics, notices
states.py        the states a run and each node's part in it go through

watch/           every read of a running job and what the reads add up to: health, hangs, stragglers, blame
recovery/        relaunches after a failure, their driver, and the checkpoint asked before SLURM's time limit
export/          the files a run is exported as: batch scripts and the engines' job files
tools/           the worker's one-shot tools on the master: the data preview, merge and chat
slurm/           a run on SLURM: an allocation's nodes, and a batch job submitted and followed from a login node
"""
