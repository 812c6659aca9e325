"""The nodes: how each is reached, what it is checked for, and what is set up on it. Its rooms import down
(pyproject.toml's nodes-rooms contract): keys, sync > connect, checks > slurm, hostlists > transport > hubmodel,
jobs > programs, results.

keys.py       SSH key setup done for the user, then the all-pairs check the launchers need
sync.py       data, model and code copied from the master where the probe found them missing, then verified
connect.py    from a preset node to a connected transport: this machine, SSH (with ssh_config), or srun
hostlists.py  node lists people already have (a hostfile, a SLURM node list, ssh_config's hosts), as preset nodes
hubmodel.py   hub models downloaded once on the master and synced to the others: where they live
jobs.py       which processes on a node are a job qwen-tui started, proven before they are signalled
programs.py   the programs sent to the nodes, read from remote/ (standard-library Python and POSIX shell)
results.py    per-node results: every action on the nodes answers for every node

transport/    the Transport protocol: this machine, SSH, host keys, ssh_config
checks/       the checks before a launch: probe, consistency, ports, firewall, bandwidth, topology, rehearsal
slurm/        a SLURM allocation's nodes through srun, and what SLURM's controller says
remote/       the node-side programs themselves (not a package: programs.py reads them as files)
"""
