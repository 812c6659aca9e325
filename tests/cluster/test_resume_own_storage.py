"""shared_storage: false on two namespace nodes: each node keeps its own checkpoints (its own workdir and
output_dir here), and a resume picks the newest step every node holds complete, or refuses naming the nodes."""

from __future__ import annotations

import json
import os
import re
import shutil

from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.schema import Preset
from qwen_tui.run.launcher import Launcher
from qwen_tui.run.rundir import RunDir
from support.cluster import REPO, preset_dict

NODES = 2


def _workdirs(tmp_path) -> list:
    """A workdir per node, holding the worker (a link to this checkout) and, later, the node's own output."""
    dirs = []
    for i in range(NODES):
        d = tmp_path / f"node{i}-work"
        d.mkdir()
        (d / "training").symlink_to(REPO / "training")
        dirs.append(d)
    return dirs


def _preset(cluster, sshdir, tmp_path, workdirs, **training) -> Preset:
    d = preset_dict(cluster, sshdir, output_dir="out", save_strategy="steps", save_steps=2, save_total_limit=None,
                    **training)
    d["cluster"]["nodes"] = d["cluster"]["nodes"][:NODES]
    for n, w in zip(d["cluster"]["nodes"], workdirs):
        n["workdir"] = str(w)
    d["cluster"]["shared_storage"] = False
    d["network"]["env"] = {"OMP_NUM_THREADS": "1"}
    return Preset.model_validate(d)


def _run(preset, tmp_path, name):
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
        master_metrics = os.path.join(preset.cluster.nodes[0].workdir, plan.nodes[0].run_dir, "metrics.jsonl")
        records = [json.loads(x) for x in open(master_metrics).read().splitlines() if x.strip()] \
            if os.path.isfile(master_metrics) else []
        return out, logs, records
    finally:
        if la is not None:
            la.stop_all()
        close_all(conns)


def _steps(out_dir) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in out_dir.glob("checkpoint-*") if not p.name.endswith(".tmp"))


def test_resume_without_shared_storage_takes_the_newest_step_every_node_holds(cluster, sshdir, keyed, tmp_path):
    work = _workdirs(tmp_path)
    out0, out1 = work[0] / "out", work[1] / "out"
    first, logs, _ = _run(_preset(cluster, sshdir, tmp_path, work, max_steps=6), tmp_path, "own1")
    assert first.status == "ok", (first.message, logs)
    assert _steps(out0) == _steps(out1) == [2, 4, 6]  # every node wrote its own copy

    # node1 died while publishing checkpoint-6: its newest complete one is 4
    os.rename(out1 / "checkpoint-6", out1 / "checkpoint-6.tmp")
    second, logs, records = _run(_preset(cluster, sshdir, tmp_path, work, max_steps=8,
                                         resume_from_checkpoint="auto"), tmp_path, "own2")
    assert second.status == "ok", (second.message, logs)
    start = [r for r in records if r.get("event") == "start"][-1]
    assert start["start_step"] == 4 and start["resumed_from"].endswith("checkpoint-4"), start
    steps = [r["step"] for r in records if "loss" in r and r.get("event") is None]
    assert steps == [5, 6, 7, 8], steps
    assert "resuming from checkpoint-4, the newest step every node holds complete" in logs[0]
    assert "node 0 (node0) has checkpoint-6" in logs[0], logs[0][-2000:]

    # no step in common (node0 kept only 8, node1 only 2 and 4): every node refuses, naming both
    for s in (2, 4, 6):
        shutil.rmtree(out0 / f"checkpoint-{s}")
    for s in (6, 8):
        shutil.rmtree(out1 / f"checkpoint-{s}")
    third, logs, _ = _run(_preset(cluster, sshdir, tmp_path, work, max_steps=10, resume_from_checkpoint="auto"),
                          tmp_path, "own3")
    assert third.status == "failed", (third.message, logs)
    for text in logs.values():  # the worker's exit 2 (bad input), as torchrun's summary reports it
        assert re.search(r"exitcode\s*:\s*2\b", text), text[-2000:]
        assert "the nodes hold no complete checkpoint in common (node 0 (node0): checkpoint-8; " \
               "node 1 (node1): checkpoint-2, checkpoint-4)" in text, text[-2000:]
    assert _steps(out0) == [8] and _steps(out1) == [2, 4]  # nothing written, nothing lost
