"""bench/fp8_worker.py's parts that need no GPU and start no worker: the worker's argv for every case (parsed by the
worker's own parser), the data's exact record lengths, an arm's figures from its metrics records, the verdict and
whether `auto` agrees, and the table. `python bench/fp8_worker.py --cpu-smoke` runs the bench itself on the CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import fp8_worker as fw


@pytest.mark.parametrize("name", list(fw.CASES) + list(fw.SMOKE_CASES))
def test_every_case_gives_the_worker_flags_it_accepts(name):
    from training.args import parse_args

    table = fw.SMOKE_CASES if name in fw.SMOKE_CASES else fw.CASES
    case = table[name]
    for fp8 in ("off", "on"):
        cmd = fw.worker_cmd(case, Path("/m"), Path("/d.jsonl"), Path("/o"), fp8, 50, Path("/t"), name in fw.SMOKE_CASES)
        argv = cmd[cmd.index("training.finetune") + 1:]
        flags = parse_args(argv)  # the worker's own checks (--fp8 on needs --bf16, rows hold a record...)
        assert flags.fast.fp8 == fp8 and flags.train.bf16 and flags.fast.packing_tokens == case["row"]
        assert (cmd[1:3] == ["-m", "torch.distributed.run"]) == bool(case["zero"])
        assert flags.train.deepspeed == (f"builtin:zero{case['zero']}" if case["zero"] else None)
        assert flags.train.gradient_checkpointing == (True if case.get("ckpt") else None)
        if case["row"]:
            assert case["row"] % case["seq"] == 0 and (case["records"] * case["seq"]) % case["row"] == 0
        else:  # the worker's memory probe sizes the rows, as a user's run gets them
            assert "--packing_tokens" not in argv and flags.fast.auto_micro_batch is not False


def test_the_default_cases_are_known_and_each_sized_case_has_a_probed_twin():
    assert set(fw.DEFAULT_CASES) <= set(fw.CASES)
    for name in fw.DEFAULT_CASES:
        twin = fw.CASES[f"{name}-rows"]
        assert twin["row"] is None and twin["shape"] == fw.CASES[name]["shape"]
        assert fw.LOOP_RATIOS[f"{name}-rows"] == fw.LOOP_RATIOS[name]


def test_the_probe_an_arm_logged_is_read_from_its_own_part_of_the_log(tmp_path):
    log = tmp_path / "fp8_worker.log"
    log.write_text("===== full-1.5b-rows bf16: python -m training.finetune\n"
                   "[rank0] auto micro-batch probes: 1024 tokens -> 9.00 GiB peak, 2048 tokens -> 9.90 GiB peak\n"
                   "===== full-1.5b-rows fp8: python -m training.finetune\n"
                   "12:00:01 INFO auto micro-batch probes: 1024 tokens -> 9.88 GiB peak, 2048 tokens -> 9.93 GiB "
                   "peak, 16384 tokens -> 18.40 GiB peak\n"
                   "12:00:02 INFO auto micro-batch: 0.90 MiB a token, 15.5 GiB fixed -> packed rows of 59392 tokens\n")
    fp8 = fw.probe_lines(str(log), "full-1.5b-rows", "fp8")
    assert fp8 == ["auto micro-batch probes: 1024 tokens -> 9.88 GiB peak, 2048 tokens -> 9.93 GiB peak, "
                   "16384 tokens -> 18.40 GiB peak",
                   "auto micro-batch: 0.90 MiB a token, 15.5 GiB fixed -> packed rows of 59392 tokens"]
    assert fw.probe_lines(str(log), "full-1.5b-rows", "bf16") == [
        "auto micro-batch probes: 1024 tokens -> 9.00 GiB peak, 2048 tokens -> 9.90 GiB peak"]


def test_the_data_has_records_of_exactly_the_asked_length(tmp_path, tiny_model):
    lens = fw.write_data(tmp_path / "d.jsonl", tiny_model, 6, 64)
    assert lens == [64] * 6
    assert len((tmp_path / "d.jsonl").read_text().splitlines()) == 6


def records(steps=50, tps=10_000.0, fp8=False, loss0=7.0, drift=0.0, matmuls=588, guard_ok=True, row=8192,
            checkpointing=False):
    out = [{"event": "start", "fast_path": {"fp8": fp8, "why": {"fp8": "on as given" if fp8 else "off as given"},
                                            "packing_tokens": row, "gradient_checkpointing": checkpointing}}]
    if fp8:
        out.append({"event": "fp8", "converted": 196, "skipped": 0, "skipped_layers": [], "torchao": "0.17.0"})
    for s in range(1, steps + 1):
        out.append({"step": s, "loss": loss0 - 0.01 * s + drift * s / steps, "tokens": 4096,
                    "step_time": 4096 / tps if s > 1 else 30.0, "micro_batches": 1, "peak_memory_gib": 40.0})
        if fp8 and s == 2:
            out.append({"event": "fp8_profile", "step": 2, "fp8_matmuls": matmuls, "fp8_gemm_kernels": matmuls,
                        "engaged": matmuls > 0, "active": True})
        if fp8 and s <= 8:
            out.append({"event": "fp8_guard", "step": s, "worst_rel_diff": 0.003, "ok": guard_ok})
    return out


def test_an_arm_is_timed_after_its_warm_up_and_its_fp8_proof_read():
    r = fw.summarise(records(tps=10_000.0, fp8=True), 50, 10)
    assert r["status"] == "ok" and r["timed_steps"] == 40 and r["tokens_per_s"] == pytest.approx(10_000.0)
    assert r["first_step_s"] == 30.0 and len(r["losses"]) == 50 and r["fast_path_fp8"] is True
    assert r["fp8"]["converted"] == 196 and r["fp8_profile"]["fp8_matmuls"] == 588
    assert r["fp8_guard"] == {"steps": list(range(1, 9)), "max_rel_diff": 0.003, "all_ok": True}
    cut = fw.summarise(records(steps=30), 50, 10)
    assert cut["status"] == "failed" and "30 of 50 steps" in cut["error"]


def case_with(bf16, fp8, auto_on):
    return {"case": "lora-7b", "layers": 28, "tokens_per_step": 8192, "records": 8, "seq": 1024,
            "auto": {"on": auto_on, "why": "..."},
            "arms": {"bf16": fw.summarise(bf16, 50, 10), "fp8": fw.summarise(fp8, 50, 10)}}


@pytest.mark.parametrize("fp8_tps,drift,matmuls,auto_on,verdict,agrees", [
    (12_500.0, 0.0, 588, True, "fp8 pays", True),
    (12_500.0, 0.0, 588, False, "fp8 pays", False),
    (10_300.0, 0.0, 588, False, "fp8 within noise", True),
    (9_000.0, 0.0, 588, False, "fp8 slower", True),
    (12_500.0, 1.0, 588, True, "loss drifts", False),
    (12_500.0, 0.0, 0, True, "fp8 did not engage", False),
])
def test_the_verdict_and_whether_auto_agrees(fp8_tps, drift, matmuls, auto_on, verdict, agrees):
    c = case_with(records(tps=10_000.0), records(tps=fp8_tps, fp8=True, drift=drift, matmuls=matmuls), auto_on)
    cmp_ = fw.compare(c)
    assert cmp_["verdict"] == verdict and cmp_["auto_agrees"] is agrees
    assert cmp_["ratio"] == pytest.approx(fp8_tps / 10_000.0, abs=1e-3) and cmp_["parity_steps"] == 50
    assert list(cmp_["loss_at"]) == ["1", "25", "50"]


def test_a_bf16_arm_that_ran_fp8_or_a_failed_arm_is_no_measurement():
    c = case_with(records(fp8=True), records(fp8=True), True)
    assert fw.compare(c)["verdict"] == "bf16 arm ran FP8"
    c = case_with(records(), records(steps=3, fp8=True), True)
    assert fw.compare(c)["verdict"] == "error"


def test_an_arm_the_budget_stopped_is_cut_not_failed():
    arm = {"stop": "cut: past the budget", **fw.summarise(records(steps=18, fp8=True), 50, 10)}
    fw.cut_by_budget(arm, 50)
    assert arm["status"] == "cut" and arm["error"] == "cut at the budget after 18 of 50 steps"
    failed = {"stop": None, **fw.summarise(records(steps=18, fp8=True), 50, 10)}
    fw.cut_by_budget(failed, 50)
    assert failed["status"] == "failed"
    c = case_with(records(), records(), True)
    c["arms"]["fp8"] = arm
    c["compare"] = fw.compare(c)
    assert c["compare"]["verdict"] == "cut"
    c.update(case="lora-7b", layers=28, tokens_per_step=8192)
    doc = {"date": "2026-12-05", "gpu": "H100", "versions": {}, "elapsed_s": 402.0, "budget_s": 400.0, "steps": 50,
           "warmup": 10, "cases": [c]}
    text = fw.markdown(doc)
    assert "| cut |" in text and "**cut**" in text and "- lora-7b fp8 cut: cut at the budget after 18" in text


def test_the_cases_fit_the_budget_and_the_budget_a_call():
    """The default cases' estimates fit the default budget, and any one case alone; the budget, the wheels' install
    and the longest stop of a cut arm fit the device call."""
    assert sum(fw.CASES[n]["est_s"] for n in fw.DEFAULT_CASES) <= fw.BUDGET_S
    assert max(c["est_s"] for c in fw.CASES.values()) <= fw.BUDGET_S
    assert fw.INSTALL_S + fw.BUDGET_S + fw.STOP_WAIT_S + fw.KILL_WAIT_S < fw.CALL_S


def test_the_table_shows_every_case_skips_and_failures():
    ok = case_with(records(tps=10_000.0), records(tps=12_500.0, fp8=True), True)
    ok["compare"] = fw.compare(ok)
    bad = case_with(records(), records(steps=3, fp8=True), False)
    bad.update(case="full-7b-zero3", layers=12, tokens_per_step=4096)
    bad["compare"] = fw.compare(bad)
    doc = {"date": "2026-12-06", "gpu": "NVIDIA H100 80GB HBM3", "versions": {"torch": "2.11.0"}, "elapsed_s": 400.0,
           "budget_s": 500.0, "steps": 50, "warmup": 10,
           "cases": [ok, bad, {"case": "full-1.5b", "skipped": "20 s of the budget left, the case needs about 120 s"}]}
    text = fw.markdown(doc)
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith(("| case", "| ---"))]
    assert len(rows) == 3
    assert "| lora-7b | 28 | 8,192 | 10,000 | 12,500 | 1.250 (1.257) |" in rows[0] and "on (agrees)" in rows[0]
    assert "**fp8 pays**" in rows[0] and "196 (0)" in rows[0] and "588 / 588" in rows[0]
    assert "**error**" in rows[1] and "**skipped**: 20 s of the budget left" in rows[2]
    assert "- full-7b-zero3 fp8 failed: 3 of 50 steps recorded" in text


def test_the_table_says_how_long_each_arms_rows_were_and_who_sized_them():
    probed = case_with(records(row=9216), records(row=10240, fp8=True, checkpointing=True), False)
    probed.update(case="lora-7b-rows", row=None)
    given = case_with(records(row=4096), records(row=4096, fp8=True), False)
    given.update(row=4096)
    doc = {"date": "2026-12-06", "gpu": "H100", "versions": {}, "elapsed_s": 1.0, "budget_s": 500.0, "steps": 50,
           "warmup": 10, "cases": [given, probed]}
    text = fw.markdown(doc)
    assert "- lora-7b: rows as given: bf16 4,096 tokens (1 a step); fp8 4,096 tokens (1 a step)" in text
    assert ("- lora-7b-rows: rows sized by the worker's memory probe: bf16 9,216 tokens (1 a step); fp8 10,240 "
            "tokens (1 a step, gradient checkpointing)") in text


def test_auto_takes_its_second_look_at_the_rows_the_fp8_arm_ran():
    short = case_with(records(row=4096), records(row=4096, fp8=True, tps=9_400.0), True)
    cmp_ = fw.compare(short)
    assert short["auto"]["on"] is False and "about 4,096 tokens (8 records of 1,024" in short["auto"]["why"]
    assert short["auto"]["before_rows"] == "..." and cmp_["auto_agrees"] is True  # slower, and auto now off
    long = case_with(records(), records(fp8=True, tps=11_200.0), True)
    assert fw.compare(long)["auto_agrees"] is True and long["auto"]["on"] is True
