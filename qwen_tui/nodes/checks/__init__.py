"""The checks before a launch: what each node is and holds, and whether the nodes can train together. They only
look (they copy, install and set up nothing: that is sync.py's and keys.py's), over transports they are given.

runner.py     all checks in one pass (connect, probe, consistency, limits, ports, firewall, bandwidth) filling
              ClusterFacts, each finding placed in the node x check matrix; the network checks again on their own
probe.py      one program per node, run by the node's own Python: its stack, GPUs, data, disk and limits as NodeFacts
netcheck.py   between the master and the workers: the ports, the firewall, iperf3's bandwidth
topology.py   a node's GPUs and how they reach each other (nvidia-smi topo), parsed; pure
ibcheck.py    InfiniBand/RoCE: the HCAs the probe found, and the network NCCL chose in the rehearsal
storage.py    whether the output directory is one filesystem on every node, measured
rehearsal.py  a few-second torchrun job on every node: the rendezvous and an all-reduce with the run's settings
containers.py a preset's container runtime on each node: runtime and image there, the probe inside the image,
              what a container that does not start said (and, for the launcher's stop, the run's container removed)
findings.py   a check's finding: an Issue with its fix and its cell of the matrix
codes.py      every code a check reports, what raises it and what fixes it (the manual's reference is built from it)
"""
