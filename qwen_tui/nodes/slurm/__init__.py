"""A SLURM allocation's nodes, reached through SLURM's own commands instead of SSH.

queries.py     what qwen-tui asks the controller (scontrol, squeue, sinfo, sbatch, scancel), parsed into plain data
agent_link.py  one node's command server (remote/agent.py) behind a local process's pipes
job_watch.py   SLURM's word on a running job and its nodes (ended, requeued, a node down), asked in the background
transport.py   SlurmTransport: the Transport protocol on one node of an allocation (checks and reads through its
               agent's `srun --overlap` step, the training job as a job step of its own)
"""
