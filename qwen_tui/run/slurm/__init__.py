"""A run on SLURM: the nodes of an allocation, the batch script qwen-tui submits, and following the job.

- `allocation`: a SLURM preset inside an allocation (salloc, or the batch job itself) becomes a preset of the
  allocation's nodes, reached through srun (nodes/slurm);
- `script`: the batch script, the one `qwen-tui replay` submits and `qwen-tui export --format slurm` writes;
- `submit`: the run directory and the sbatch of that script from a login node;
- `job_watch`: what SLURM says of the job and its nodes while it runs, as the run's outcome when it ends.
"""
