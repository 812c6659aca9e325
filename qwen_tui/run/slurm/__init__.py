"""A run on SLURM's nodes.

allocation.py  a SLURM preset inside an allocation (salloc, or the batch job itself) becomes a preset of the
               allocation's nodes, each reached through srun (nodes/slurm/)
job.py         a batch job from a login node, as the launch API's steps: submitted, then followed through SLURM's
               states as events every face renders

The batch script the job runs is run/export/slurm_preset.py's; what replay prints of it, inside an allocation or
from a login node, is cli/slurm_inside.py's and cli/slurm_batch.py's.
"""
