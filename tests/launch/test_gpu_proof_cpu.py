"""bench/gpu_proof.py, the one-call GPU proof, run for real on this machine's CPUs (--cpu).

The multi-process lines that are cheap here run: the collectives (all-reduce and all-gather bus bandwidth) on two
gloo ranks, `qwen-tui check` with its rehearsal and `qwen-tui replay` (qwen-tui's own launcher) on two "nodes"
reached over SSH through the sshds the proof sets up on spare ports with a throwaway key. The lines only GPUs can
answer must come back skipped with the reason, never passed. The other multi-process lines (ZeRO-2 and ZeRO-3
against one rank, MoE under ZeRO-3, sequence parallelism, the sharded 4-bit base) run the same worker paths
tests/training covers; `python bench/gpu_proof.py --cpu` runs them all (about two CPU-minutes), left out here
for the suite's time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import proof_lines as pl

pytestmark = pytest.mark.slow

GPU_ONLY = {x.name for x in pl.LINES if x.gpu_only}
RUN_ON_CPU = ["collectives", "check", "launcher"]


@pytest.fixture(scope="module")
def cpu_proof(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, str]:
    out = tmp_path_factory.mktemp("proof")
    skip = [x.name for x in pl.LINES if x.name not in RUN_ON_CPU and x.name not in GPU_ONLY]
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_proof.py"), "--cpu", "--out", str(out),
                          "--skip", ",".join(skip)], capture_output=True, text=True, timeout=900, cwd=out)
    data = json.loads((out / "gpu_proof.json").read_text())
    return res, data, (out / "gpu_proof.md").read_text()


def test_cpu_proof_runs_the_multi_process_lines_and_skips_the_gpu_ones_saying_why(cpu_proof):
    res, data, md = cpu_proof
    lines = {x["line"]: x for x in data["lines"]}
    assert list(lines) == [x.name for x in pl.LINES]  # every line, in order, whatever ran
    for name in RUN_ON_CPU:
        assert lines[name]["verdict"] == "pass", (name, lines[name], res.stdout[-3000:])
    for name in GPU_ONLY:
        assert lines[name]["verdict"] == "skipped" and "needs CUDA GPUs" in lines[name]["detail"], lines[name]
    for x in data["lines"]:
        if x["line"] not in RUN_ON_CPU:
            assert x["verdict"] == "skipped" and x["detail"], x
    assert res.returncode == 0, res.stdout[-3000:]
    assert data["mode"] == "cpu" and data["summary"] == {"pass": 3, "fail": 0, "slow": 0,
                                                         "skipped": len(pl.LINES) - 3}
    # what each line saw, from the runs themselves
    coll = lines["collectives"]["measured"]
    assert coll["backend"] == "gloo" and coll["ranks"] == 2 and coll["all_reduce_busbw_gbs"] > 0
    assert all(s["all_reduce_correct"] and s["all_gather_correct"] for s in coll["sizes"])
    assert lines["check"]["measured"]["matrix"]["proof-node-1"]["rehearsal"] == "ok"
    assert "2 nodes over SSH" in lines["check"]["detail"]
    launch = lines["launcher"]["measured"]
    assert launch["world_size"] == 2 and launch["end"]["status"] == "ok"
    assert {lines[x]["detail"] for x in ("zero2-curve", "moe-zero3")} == {"not selected (--only / --skip)"}
    # the table: one row a line, its verdict in bold, the skipped ones with their reason
    rows = [r for r in md.splitlines() if r.startswith("| ") and not r.startswith("| line") and "---" not in r]
    assert len(rows) == len(pl.LINES)
    assert "| speed-7b-lora | **skipped** |" in md and "needs CUDA GPUs" in md
    assert "| speed-7b-lora-dpo | **skipped** | 0 | - | needs CUDA GPUs" in md
    assert md.startswith("GPU proof ") and "CPU ranks (gloo)" in md.splitlines()[0]
