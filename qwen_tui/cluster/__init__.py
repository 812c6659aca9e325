"""What is known about the nodes: their facts as the probe found them (facts), InfiniBand ports and their NCCL
settings (ib), and the log signatures of known failures with their cause and fix (failures)."""
