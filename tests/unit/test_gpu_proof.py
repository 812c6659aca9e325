"""bench/gpu_proof.py's parts that need no GPU and start no process: which lines run on 0, 1, 2 or 8 GPUs and why
the others are skipped, the scheduler that shares several GPUs between lines (on fake lines: no GPU here), the
10% rule against the README's figures (read from the bench/results files the README cites), the curves'
comparison, the results' own rules. tests/launch/test_gpu_proof_cpu.py runs the proof itself on CPU ranks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import gpu_proof
import proof_lines as pl
import proof_speed


def fake_line(name: str, gpus: int, est: float = 1.0, after=(), seen=None, sleep: float = 0.05,
              verdict: str = "pass") -> pl.Line:
    def run(ctx: pl.Context) -> pl.Result:
        seen.append((name, tuple(ctx.gpu_ids), time.monotonic()))
        time.sleep(sleep)
        if verdict == "boom":
            raise RuntimeError("a bug in the line")
        return pl.Result(name, "", verdict, f"ran on {ctx.gpu_ids}")
    return pl.Line(name, f"fake {name}", gpus, False, est, run, after=after)


def ctx_for(tmp_path: Path, ngpus: int, budget: float = 60.0) -> pl.Context:
    return pl.Context(out=tmp_path, scratch=tmp_path, cpu=False, ngpus=ngpus, deadline=time.monotonic() + budget,
                      env={}, log=tmp_path / "log")


def test_scheduler_shares_the_gpus_between_lines_side_by_side_and_keeps_their_order(tmp_path):
    seen: list = []
    lines = [fake_line("all", 0, seen=seen), fake_line("pair-a", 2, seen=seen, sleep=0.3),
             fake_line("pair-b", 2, seen=seen, sleep=0.3), fake_line("reader", 2, after=("all",), seen=seen),
             *[fake_line(f"one-{i}", 1, seen=seen, sleep=0.3) for i in range(3)],
             fake_line("broken", 1, seen=seen, verdict="boom"),
             fake_line("too-long", 1, est=600.0, seen=seen)]
    ctx = ctx_for(tmp_path, 8)
    gpu_proof.Scheduler(ctx, lines, parallel=True, own_process=set()).run(lines)
    got = {n: (g, t) for n, g, t in seen}
    assert got["all"][0] == tuple(range(8))  # a line of all GPUs has them alone
    assert all(t >= got["all"][1] for n, (_, t) in got.items() if n != "all")
    assert got["reader"][1] >= got["all"][1]
    # lines running at the same time never share a GPU
    spans = {r.line: (got[r.line][1], got[r.line][1] + r.seconds, set(r.gpus)) for r in ctx.results.values()
             if r.line in got}
    for a, (s1, e1, g1) in spans.items():
        for b, (s2, e2, g2) in spans.items():
            if a < b and s1 < e2 and s2 < e1:
                assert not g1 & g2, (a, b, g1, g2)
    assert len({got["pair-a"][0], got["pair-b"][0]}) == 2 and len(got["pair-a"][0]) == 2
    assert got["pair-a"][1] < got["pair-b"][1] + 0.25  # side by side, not one after the other
    # a line's bug is its verdict; a line that cannot finish in the budget is skipped, saying so
    assert ctx.results["broken"].verdict == "fail" and "RuntimeError: a bug in the line" in ctx.results["broken"].detail
    assert ctx.results["too-long"].verdict == "skipped" and "budget" in ctx.results["too-long"].detail
    assert "too-long" not in got
    assert {r.verdict for n, r in ctx.results.items() if n not in ("broken", "too-long")} == {"pass"}


def test_one_gpu_runs_the_speed_lines_and_skips_the_multi_gpu_ones_naming_the_count():
    for ngpus, runs in ((1, {"speed-7b-lora", "speed-7b-lora-dpo", "speed-1.5b-full", "speed-moe-lora",
                             "speed-longest-record"}),
                        (2, {x.name for x in pl.LINES}), (8, {x.name for x in pl.LINES})):
        for x in pl.LINES:
            why = gpu_proof.skip_reason(x, cpu=False, ngpus=ngpus, missing={}, selected=True)
            assert (why == "") == (x.name in runs), (ngpus, x.name, why)
            if ngpus == 1 and x.name not in runs:
                assert why == "needs 2+ GPUs, 1 here"
    x = next(x for x in pl.LINES if x.name == "zero2-curve")
    assert gpu_proof.skip_reason(x, cpu=False, ngpus=0, missing={}, selected=True).startswith("no CUDA GPU here")
    why = gpu_proof.skip_reason(x, cpu=False, ngpus=2, missing={"deepspeed": "not installed"}, selected=True)
    assert why.startswith("deepspeed not importable: carry the wheels") and "--fetch-wheels" in why


def test_a_speed_more_than_ten_percent_under_the_readme_figure_is_flagged_slow():
    ref = pl.reference(*pl.REFERENCES["speed-7b-lora"])
    assert ref["file"] == "bench/results/train_speed-2026-11-30-H200-run19.json"
    assert round(ref["tokens_per_s"]) == 17600 and round(ref["mfu"], 3) == 0.526  # the README's 17,600 and 52.6%
    for line, rate in (("speed-1.5b-full", 57558), ("speed-moe-lora", 23399), ("speed-longest-record", 1457)):
        assert round(pl.reference(*pl.REFERENCES[line])["tokens_per_s"]) == rate
    assert pl.verdict_of_speed(0.91 * 17600, 17600) == "pass"
    assert pl.verdict_of_speed(0.89 * 17600, 17600) == "slow"
    res = pl._speed_result("speed-7b-lora", {"status": "ok", "tokens_per_s": 14000.0, "mfu": 0.42})
    assert res.verdict == "slow" and "0.80x" in res.detail and "more than 10% under" in res.detail
    assert res.reference["tokens_per_s"] == ref["tokens_per_s"]
    # each stated figure names its GPU; measured on another, the line says so (here: no GPU at all)
    assert {pl.reference(*pl.REFERENCES[k])["gpu"] for k in pl.REFERENCES} == {"NVIDIA H200"}
    assert "the stated figure is an NVIDIA H200's: another GPU" in res.detail
    assert proof_speed.other_gpu("NVIDIA H100 80GB HBM3", "NVIDIA H200")
    assert not proof_speed.other_gpu("NVIDIA H200", "NVIDIA H200") and not proof_speed.other_gpu("cpu", None)
    with pytest.raises(pl.LineFailed, match="OOM"):
        pl._speed_result("speed-7b-lora", {"status": "OOM", "error": "CUDA out of memory"})


def test_dpo_speed_is_set_beside_this_calls_sft_line_and_passes_only_with_finite_losses(tmp_path):
    ctx = ctx_for(tmp_path, 1)
    stated = proof_speed._sft_beside(ctx)  # no SFT line ran in this call: the stated figure
    assert round(stated["tokens_per_s"]) == 17600 and "train_speed-2026-11-30-H200-run19.json" in stated["source"]
    (tmp_path / "result-speed-7b-lora.json").write_text(json.dumps(
        {"verdict": "pass", "measured": {"tokens_per_s": 16000.0, "mfu": 0.48}}))
    sft = proof_speed._sft_beside(ctx)
    assert sft == {"tokens_per_s": 16000.0, "mfu": 0.48, "source": "this call's speed-7b-lora"}
    run = {"status": "ok", "tokens_per_s": 12000.0, "mfu": 0.36, "losses": [0.6931, 0.69], "losses_finite": True,
           "reference_tokens_per_s": 48000.0, "epoch_tokens_per_s": 9600.0, "epoch_mfu": 0.43}
    res = pl.dpo_speed_result(run, sft)
    assert res.verdict == "pass" and res.measured["ratio_to_sft"] == 0.75 and res.measured["epoch_ratio_to_sft"] == 0.6
    assert "12,000 tokens/s (chosen + rejected tokens), MFU 36.0%: 0.75x SFT's 16,000" in res.detail
    assert "48,000 tokens/s): 9,600 tokens/s, MFU 43.0%, 0.60x SFT's" in res.detail
    bad = pl.dpo_speed_result({**run, "losses": [0.6931, float("nan")], "losses_finite": False}, sft)
    assert bad.verdict == "fail" and "not finite" in bad.detail
    with pytest.raises(pl.LineFailed, match="OOM"):
        pl.dpo_speed_result({"status": "OOM", "error": "CUDA out of memory"}, sft)


def test_results_refuse_an_unknown_verdict_and_a_skip_without_reason():
    with pytest.raises(ValueError):
        pl.Result("x", "", "ok", "")
    with pytest.raises(ValueError, match="must say why"):
        pl.Result("x", "", "skipped", "")


def test_curves_compare_step_by_step_within_the_tolerance():
    ref = [{"event": "start"}] + [{"step": i, "loss": 2.0 - 0.1 * i, "grad_norm": 1.0} for i in range(1, 4)]
    near = [{"event": "start"}] + [{"step": i, "loss": 2.0 - 0.1 * i + 1e-5, "grad_norm": 1.0} for i in range(1, 4)]
    ok, words, worst = pl.compare(ref, near, pl.TOL["cpu"])
    assert ok and "3 steps" in words and worst["loss"] < 1e-4
    far = [dict(r, grad_norm=1.5) if r.get("step") == 2 else r for r in near]
    ok, words, _ = pl.compare(ref, far, pl.TOL["cpu"])
    assert not ok and "grad_norm off by up to 50%" in words
    ok, words, _ = pl.compare(ref, near[:-1], pl.TOL["cpu"])
    assert not ok and "steps differ" in words


def test_unknown_lines_are_refused_naming_the_known_ones():
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_proof.py"), "--only", "zero9-curve"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "zero9-curve" in res.stderr and "zero2-curve" in res.stderr


def test_lines_side_by_side_share_one_state(tmp_path):
    """The collectives' bandwidth reaches the scaling line, the check's report the transport line."""
    ctx = ctx_for(tmp_path, 2)
    box = threading.Event()

    def writer(c):
        c.shared["intra_node_gbs"] = 123.0
        box.set()
        return pl.Result("w", "", "pass", "wrote")

    def reader(c):
        return pl.Result("r", "", "pass" if c.shared.get("intra_node_gbs") == 123.0 else "fail", "read")

    lines = [pl.Line("w", "", 0, False, 1, writer), pl.Line("r", "", 2, False, 1, reader, after=("w",))]
    gpu_proof.Scheduler(ctx, lines, parallel=True, own_process=set()).run(lines)
    assert box.is_set() and ctx.results["r"].verdict == "pass"


def test_the_measured_bus_bandwidth_and_one_gpus_speed_feed_the_estimator(tmp_path):
    ctx = ctx_for(tmp_path, 8)
    slow, fast = pl.estimator_with(ctx, 20.0, 8), pl.estimator_with(ctx, 400.0, 8)
    assert slow["measured_gbs"] == 20.0 and slow["table_gbs"] == fast["table_gbs"] > 0
    assert 0 < slow["predicted_efficiency"] < fast["predicted_efficiency"] <= 1.0
    # given one GPU's measured speed, the model's one-GPU step is that speed (its compute efficiency is solved for)
    based = pl.estimator_with(ctx, 400.0, 8, rows=2, base_tokens_per_s=40_000.0)
    assert 0 < based["base_efficiency"] < 1 and based["rows"] == 2
    ctx.cpu = True
    assert pl.estimator_with(ctx, 400.0, 8) is None  # CPU ranks model nothing the estimator knows


def test_a_line_of_all_the_gpus_is_not_overtaken_by_the_lines_after_it(tmp_path):
    seen: list = []
    lines = [fake_line("pair", 2, seen=seen, sleep=0.3), fake_line("all", 0, seen=seen),
             fake_line("single", 1, seen=seen)]
    ctx = ctx_for(tmp_path, 4)
    gpu_proof.Scheduler(ctx, lines, parallel=True, own_process=set()).run(lines)
    got = {n: (g, t) for n, g, t in seen}
    assert got["all"][0] == (0, 1, 2, 3) and got["single"][1] >= got["all"][1] >= got["pair"][1] + 0.25
