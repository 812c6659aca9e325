"""A run as a file another launcher runs: the same plan (argv and environment) as `replay`, written out. An export
touches no node.

render.py        every format of `qwen-tui export`: batch scripts of a plan (SLURM's sbatch + srun, PBS, one shell
                 script per node), the engines' job files, and the files a preset exports to (export_files)
slurm_preset.py  a SLURM preset's batch script: the one `replay` submits from a login node (qwen-tui replays the
                 preset inside the allocation) and `export --format slurm` writes
engine_argv.py   what the engines take from a plan: each node's argv with the rendezvous flags they fill in, the
                 environment split into values and secrets
kubeflow.py      a Kubeflow Trainer v2 TrainJob
skypilot.py      a SkyPilot task
"""
