"""How qwen-tui reaches a node: the Transport protocol and the ways it is spoken. It knows nothing of what is asked
over it (checks, keys, sync, the launch are above it); SLURM's srun transport is nodes/slurm/'s.

protocol.py       the Transport protocol (run, stream, copy, a detached job and its processes), its results and
                  errors, and stop_group over any transport
local.py          LocalTransport: this machine, through subprocess
ssh.py            SSHTransport: one reused paramiko connection per node (through its ProxyJump host), every step bounded
node_commands.py  what SSH and srun transports ask of a node through their own `run` (login directory, a job's
                  processes found, proven and signalled)
hostkeys.py       host key verification: known_hosts first, a new key only with consent, a changed key never
sshconfig.py      ssh_config read the way OpenSSH reads it
"""
