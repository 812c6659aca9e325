"""Tokenize once, on two namespace nodes of two ranks each, launched over SSH as replay launches them.

The cache directory given as `~/...` is each node's own (every node has its own home): local rank 0 of
each node builds it, its other rank loads it, and the next run reuses it. A directory both nodes see
(this machine's disk) is built by one rank in all. The nodes' logs count "built", "reused" and "loaded"."""

from __future__ import annotations

import os
import shutil
import uuid

from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.schema import Preset
from qwen_tui.run.launcher import Launcher
from qwen_tui.run.rundir import RunDir
from support.cluster import preset_dict

NODES = 2


def _preset(cluster, sshdir, tmp_path, cache_dir: str) -> Preset:
    d = preset_dict(cluster, sshdir, output_dir=str(tmp_path / "out"), max_steps=2, tokenized_cache_dir=cache_dir)
    d["cluster"]["nodes"] = d["cluster"]["nodes"][:NODES]
    for n in d["cluster"]["nodes"]:
        n["gpus"] = 2  # two CPU ranks a node: one builds, one waits
    d["cluster"]["shared_storage"] = True
    d["network"]["env"] = {"OMP_NUM_THREADS": "1"}
    return Preset.model_validate(d)


def _run(preset, tmp_path, name) -> dict[int, dict[str, int]]:
    """Launches, waits for success, and counts the cache's log lines on each node."""
    name = f"{name}-{os.getpid()}"
    conns = connect_all(preset)
    assert conns.ok, conns.errors_text()
    la = None
    try:
        rd = RunDir.create(tmp_path / "runs", name)
        plan = make_plan(preset, run_id=name, local_run_dir=str(rd.path))
        la = Launcher(plan, dict(conns), rd, stop_grace=5)
        la.start()
        out = la.wait(interval=0.5, max_seconds=300)
        logs = {c.rank: conns[c.rank].read_file(c.log_path).decode(errors="replace") for c in plan.nodes}
        assert out.status == "ok", (out.message, logs)
        return {r: {w: text.count(f"tokenized cache {w}:") for w in ("built", "reused", "loaded")}
                for r, text in logs.items()}
    finally:
        if la is not None:
            la.stop_all()
            shutil.rmtree(os.path.dirname(la.plan.metrics_file), ignore_errors=True)
        close_all(conns)


def test_each_node_tokenizes_once_then_reuses_and_shared_storage_tokenizes_once_in_all(
        cluster, sshdir, keyed, tmp_path):
    sub = f"qt-tok-{uuid.uuid4().hex[:8]}"
    try:
        preset = _preset(cluster, sshdir, tmp_path, f"~/{sub}")
        first = _run(preset, tmp_path, "tok1")
        assert first == {r: {"built": 1, "reused": 0, "loaded": 1} for r in range(NODES)}, first
        for i in range(NODES):  # each node's own home holds its own copy
            assert len(list((cluster.nodes[i].home / sub).glob("*.pt"))) == 1
        second = _run(preset, tmp_path, "tok2")
        assert second == {r: {"built": 0, "reused": 1, "loaded": 1} for r in range(NODES)}, second

        shared = _run(_preset(cluster, sshdir, tmp_path, str(tmp_path / "shared-tok")), tmp_path, "tok3")
        total = {w: sum(c[w] for c in shared.values()) for w in ("built", "reused", "loaded")}
        # one build in all; node1's builder candidate may find it done on its first look (reused) or wait (loaded)
        assert total["built"] == 1 and total["reused"] + total["loaded"] == 3, shared
        assert len(list((tmp_path / "shared-tok").glob("*.pt"))) == 1
    finally:
        for n in cluster.nodes:
            shutil.rmtree(n.home / sub, ignore_errors=True)
