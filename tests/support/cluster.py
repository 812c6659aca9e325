"""The namespace cluster's constants and the preset that reaches it, shared by the cluster tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from support.paths import ROOT as REPO

N_NODES = 3
# A known password, hostile on purpose: no file or log may ever contain it.
PASSWORD = "qt pa$$ 'w0rd'; $(touch /tmp/qt-pwned)"


def preset_dict(cluster, sshdir: Path, **training) -> dict:
    return {
        "name": "netns",
        "cluster": {
            "nodes": [{"host": n.hostname, "gpus": 1, "workdir": str(REPO), "python": sys.executable}
                      for n in cluster.nodes],
            "ssh_config": str(sshdir / "config"),
            "known_hosts": str(sshdir / "known_hosts"),
            "connect_timeout": 5,
        },
        "network": {"master_addr": cluster.nodes[0].addr, "master_port": 29500, "backend": "gloo",
                    "rdzv_timeout": 30},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "method": "lora",
                     "zero_stage": None, "precision": "fp32", "device": "cpu", "max_steps": 6,
                     "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1,
                     "model_max_length": 64, "gradient_checkpointing": False, "lora_r": 8,
                     "save_strategy": "no", **training},
    }


def files_holding(needle: bytes, roots) -> tuple[int, list[str]]:
    """(how many files under `roots` were read, the paths of those that contain `needle`)."""
    scanned, hits = 0, []
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for name in files:
                path = os.path.join(dirpath, name)
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError:
                    continue  # a socket, a fifo or a file gone meanwhile: nothing written there to read
                scanned += 1
                if needle in data:
                    hits.append(path)
    return scanned, hits
