"""A run on SLURM's nodes: the allocation's nodes as a preset's, and the batch script.

- `allocation`: a SLURM preset inside an allocation (salloc, or the batch job itself) becomes a preset of the
  allocation's nodes, reached through srun (nodes/slurm);
- `inside`: what `qwen-tui replay` prints and decides inside an allocation (and when a batch job takes over the
  run directory its submission made);
- `script`: the batch script, the one `qwen-tui replay` submits and `qwen-tui export --format slurm` writes.

Submitting from a login node and following the job there is run/slurm_batch.py's.
"""
