"""The GPU proof's collectives (nccl-tests' bus bandwidth, fed to the estimator) and its scaling line (measured
beside the estimator's prediction)."""

from __future__ import annotations

import json
import sys

from proof_common import BENCH, ROOT, Context, LineFailed, Result, tail, torchrun
from proof_curves import _records_files, worker


def collectives(ctx: Context) -> Result:
    n = ctx.ranks
    out = ctx.scratch / "collectives.json"
    sizes, iters = ("4,16", "5") if ctx.cpu else ("64,256,1024,4096", "20")
    env = ctx.line_env(**({"QT_PROOF_CPU": "1", "OMP_NUM_THREADS": "1"} if ctx.cpu else {}))
    res = ctx.run([*torchrun(ctx, n), str(BENCH / "proof_collectives.py"), "--json", str(out), "--sizes-mb", sizes,
                   "--iters", iters], timeout=180, env=env, what="collectives")
    if res.returncode != 0 or not out.is_file():
        raise LineFailed(f"exit {res.returncode}: {tail(res.stdout)}")
    data = json.loads(out.read_text())
    wrong = [s["size_bytes"] for s in data["sizes"] if not (s["all_reduce_correct"] and s["all_gather_correct"])]
    if wrong:
        raise LineFailed(f"wrong results at {wrong} bytes")
    big = data["sizes"][-1]
    ar, ag = big["all_reduce_busbw_gbs"], big["all_gather_busbw_gbs"]
    ctx.shared["intra_node_gbs"] = ar
    words = (f"{data['backend']} over {n} ranks at {big['size_bytes'] / 2**20:.0f} MiB: all-reduce busbw "
             f"{ar:.1f} GB/s, all-gather {ag:.1f} GB/s")
    measured = {"backend": data["backend"], "ranks": n, "sizes": data["sizes"], "all_reduce_busbw_gbs": ar,
                "all_gather_busbw_gbs": ag}
    fed = estimator_with(ctx, ar, n)
    if fed:
        measured["estimator"] = fed
        words += (f"; fed to the estimator: 1.5B full ZeRO-2 on {n} GPUs predicts {fed['predicted_efficiency']:.1%} "
                  f"scaling ({fed['table_efficiency']:.1%} with the table's {fed['table_gbs']:g} GB/s)")
    return Result("collectives", "", "pass", words, measured=measured)


def _gpu_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "unknown"


def scaling_run_shape(rows: int = 2) -> dict:
    """The workload the scaling line runs and the estimator models: Qwen2.5-1.5B full, ZeRO-2, 16 records of
    1,500-2,000 tokens a GPU a step, packed into rows of up to 16,384 tokens (about 2 a step; the measured count
    replaces it); weak scaling: the step's records grow with the GPUs."""
    return {"shape": "1.5b", "method": "full", "zero_stage": 2, "seq": 16384, "micro_batch": 1, "grad_accum": rows}


def estimator_with(ctx: Context, intra_gbs: float, n: int, rows: int = 2,
                   base_tokens_per_s: float | None = None) -> dict | None:
    """The estimator's weak-scaling efficiency from 1 to n GPUs of one node for the scaling line's workload, with
    the measured intra-node bus bandwidth and with its GPU table's. As bench/multinode_calibration.py does, the
    compute speed is the one measured on one GPU where there is one (else the worker path's own figure). GPUs
    only: on CPU ranks it models nothing."""
    if ctx.cpu:
        return None
    sys.path.insert(0, str(ROOT))
    from qwen_tui.model.spec import known_spec
    from qwen_tui.plan.estimate import GPUS, RunShape, gpu_spec
    from qwen_tui.plan.estimate_time import estimate_step, flops_per_token

    g = gpu_spec(_gpu_name()) or GPUS["H100"]
    w = scaling_run_shape(rows)
    spec = known_spec("Qwen/Qwen2.5-1.5B-Instruct")
    run = RunShape(method=w["method"], zero_stage=w["zero_stage"], seq=w["seq"], micro_batch=w["micro_batch"],
                   grad_accum=w["grad_accum"], gradient_checkpointing=False)
    eff_1 = base_tokens_per_s * flops_per_token(spec, run) / (g.bf16_tflops * 1e12) if base_tokens_per_s else None

    def eff(gbs: float) -> float:
        kw = dict(gpu_tflops=g.bf16_tflops, intra_node_gbs=gbs, hbm_gbs=g.hbm_gbs, efficiency=eff_1)
        one = estimate_step(spec, run, 1, 1, None, **kw)
        many = estimate_step(spec, run, 1, n, None, **kw)
        return many.tokens_per_second / n / one.tokens_per_second

    return {"gpu": g.name, "measured_gbs": intra_gbs, "table_gbs": g.intra_node_gbs, "rows": rows,
            "base_efficiency": eff_1, "predicted_efficiency": eff(intra_gbs), "table_efficiency": eff(g.intra_node_gbs)}


def scaling(ctx: Context) -> Result:
    """Weak scaling measured (tokens/s a GPU on n GPUs over one GPU's, same rows, same records a GPU) beside the
    estimator's prediction with the measured bus bandwidth and the measured one-GPU speed; pass within 0.10,
    the bound bench/multinode_calibration.py holds the estimator to."""
    n = ctx.ranks
    gbs = ctx.shared.get("intra_node_gbs")
    if gbs is None:
        return Result("scaling", "", "skipped", "the collectives line measured no bus bandwidth to feed the "
                      "estimator")
    w = scaling_run_shape()
    files = _records_files(ctx, "scaling", (1500, 2000), 16 * n * 6)  # 16 records a GPU a step, 6 steps
    sys.path.insert(0, str(BENCH))
    from train_speed import write_worker_inputs  # the 1.5B shape's model directory

    tps, rows = {}, 2
    for k in (1, n):
        tmp = ctx.scratch / f"scaling-{k}"
        model_dir, _, _ = write_worker_inputs(tmp, w["shape"], [])
        flags = ["--model_name_or_path", str(model_dir), "--random_init", "--data_path", files["data"],
                 "--max_steps", "6", "--logging_steps", "1", "--save_strategy", "no", "--seed", "7",
                 "--model_max_length", str(files["max_len"]), "--bf16", "--no_compile",
                 "--packing_tokens", str(w["seq"]), "--per_device_train_batch_size", "16",
                 "--gradient_accumulation_steps", "1", "--learning_rate", "1e-5", "--deepspeed", "builtin:zero2"]
        recs = worker(ctx, tmp / "out", flags, k, 300, f"scaling: {k} GPU(s)")
        steps = [r for r in recs if "event" not in r][2:]  # the first two compile and warm up
        tps[k] = sum(r["tokens"] for r in steps) / sum(r["step_time"] for r in steps)
        if k == 1:
            rows = max(1, round(sum(r.get("micro_batches", 2) for r in steps) / len(steps)))
    measured = tps[n] / n / tps[1]
    fed = estimator_with(ctx, gbs, n, rows, tps[1]) or {}
    pred = fed.get("predicted_efficiency")
    ok = pred is not None and abs(measured - pred) <= 0.10
    return Result("scaling", "", "pass" if ok else "fail",
                  f"1.5B full ZeRO-2, 1 -> {n} GPUs: {measured:.1%} measured, {pred:.1%} predicted with "
                  f"{gbs:.0f} GB/s and one GPU's speed ({tps[1]:,.0f} and {tps[n]:,.0f} tokens/s)"
                  + ("" if ok else "; the estimator is off by more than 0.10"),
                  measured={"efficiency": measured, "tokens_per_s": tps, "predicted": pred, "estimator": fed})
