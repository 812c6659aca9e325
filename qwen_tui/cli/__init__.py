"""The `qwen-tui` command: what each sub-command asks and prints. The work is the launch API's (run/api.py) and the
core's; these modules parse, call and draw with rich.

main.py          the parser; replay, demo, attach, runs, export, show (and, with no command, the wizard)
live.py          what replay, demo and attach print while a run goes: stages, checks, plan, live view, outcome
slurm_batch.py   replay and attach of a SLURM batch job from a login node: pending, running, SLURM's final state
slurm_inside.py  replay inside a SLURM allocation: its nodes, a submitted job's run directory, the time-limit warning
check.py         `check` (the node x check matrix) and `keys` (the SSH key setup)
estimate.py      `estimate`: memory, step time, scaling and the advice
data.py          `data`: the data preview
after.py         `merge` and `chat` on a finished run
facts_file.py    the --facts file of the commands that read facts without asking the nodes
options.py       what every command's --help and options share
styles.py        the commands' one table of rich styles (level, state, role)
"""
