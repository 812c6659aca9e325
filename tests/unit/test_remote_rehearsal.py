"""The rehearsal's job (qwen_tui/nodes/remote/rehearsal.py) as every rank runs it, here two ranks on gloo with
this environment's torch (the training environment), given the rendezvous variables torchrun would set: they
meet, all-reduce, and each prints the line the rehearsal reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from qwen_tui.nodes.checks.rehearsal import SNIPPET, rehearsal_argv
from support.ports import free_port

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # two processes import torch


def test_two_ranks_meet_and_report_a_correct_all_reduce():
    argv = rehearsal_argv(["torchrun", "--nnodes", "1", "-m", "training.finetune"], sys.executable, 2, 30)
    job = argv[argv.index("--no-python") + 1:]
    assert job[:3] == [sys.executable, "-c", SNIPPET]
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "QT_BACKEND": "gloo", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}
        procs.append(subprocess.Popen(job, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-2000:]
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    reports = [json.loads(next(ln for ln in out.splitlines() if ln.startswith("QT_REHEARSAL "))[13:]) for out in outs]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    for r in reports:
        assert r["world"] == 2 and r["correct"] is True and r["busbw_gbps"] > 0 and r["allreduce_s"] > 0
        assert r["size_mb"] <= 2 and r["meet_s"] >= 0 and r["host"] == os.uname().nodename
