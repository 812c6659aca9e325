"""The GPU proof's lines that run the worker on several ranks against one: ZeRO-2 and ZeRO-3, MoE under ZeRO-3
with leaf modules, sequence parallelism, the 4-bit base sharded by ZeRO-3. On GPUs a small real-shaped model
(Qwen2.5-0.5B's shape, random-init, bf16); on CPU ranks the tiny built-in models."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from proof_common import BENCH, GPU_SHAPE, TOL, Context, LineFailed, Result, tail, torchrun


def _records_files(ctx: Context, name: str, lengths: tuple[int, int], n: int, moe: bool = False) -> dict:
    """A model directory and chat data for the curve lines: on CPU the tiny built-in models and synthetic records
    on their vocabulary; on GPUs the real shape (random weights built by the worker) and records on the tiny
    tokenizer's words, which the real-sized vocabulary takes as well as any."""
    key = f"files:{name}"
    if key in ctx.shared:
        return ctx.shared[key]
    sys.path.insert(0, str(BENCH))
    import random

    from train_speed import write_worker_inputs  # the same chat records the speed benchmarks train on

    tmp = ctx.scratch / f"data-{name}"
    rng = random.Random(0)
    recs = [SimpleNamespace(input_ids=[0] * rng.randint(*lengths)) for _ in range(n)]
    shape = "tiny" if ctx.cpu else GPU_SHAPE
    model_dir, data, lens = write_worker_inputs(tmp, shape, recs)
    if moe:
        from moe_speed import model_dir_for

        model_dir = Path("builtin:tiny-moe") if ctx.cpu else model_dir_for(tmp, "proof")
    elif ctx.cpu:
        model_dir = Path("builtin:tiny")
    files = {"model": str(model_dir), "data": str(data), "max_len": max(lens), "random_init": not ctx.cpu}
    ctx.shared[key] = files
    return files


def worker(ctx: Context, out: Path, flags: list[str], nproc: int, timeout: float, what: str) -> list[dict]:
    """The worker as users run it (`python -m training.finetune`, or under torchrun); its metrics records."""
    cmd = [sys.executable, "-m", "training.finetune"] if nproc == 1 else [*torchrun(ctx, nproc), "-m",
                                                                         "training.finetune"]
    env = ctx.line_env()
    if ctx.cpu:
        env["OMP_NUM_THREADS"] = "1" if nproc > 1 else env.get("OMP_NUM_THREADS", "2")
    elif nproc == 1:
        env["CUDA_VISIBLE_DEVICES"] = ctx.devices(ctx.gpu_ids[:1])
    res = ctx.run([*cmd, "--output_dir", str(out), *flags], timeout=timeout, env=env, what=what)
    ctx.shared[f"output:{what}"] = res.stdout
    metrics = out / "metrics.jsonl"
    recs = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    if res.returncode != 0 or not any("event" not in r for r in recs):
        raise LineFailed(f"{what}: exit {res.returncode}: {tail(res.stdout)}")
    return recs


def common_flags(ctx: Context, files: dict, steps: int, extra: list[str]) -> list[str]:
    f = ["--model_name_or_path", files["model"], "--data_path", files["data"], "--max_steps", str(steps),
         "--logging_steps", "1", "--save_strategy", "no", "--seed", "7", "--warmup_ratio", "0.1",
         "--model_max_length", str(files["max_len"])]
    if files["random_init"]:
        f.append("--random_init")
    if ctx.cpu:
        f.append("--use_cpu")
    else:  # bf16 with fp32 masters, eager (the curve, not the speed: compiling would take most of the line's time)
        f += ["--bf16", "--no_compile"]
    return f + extra


def compare(ref: list[dict], got: list[dict], tol: dict, keys=("loss", "grad_norm")) -> tuple[bool, str, dict]:
    """Step by step within the relative tolerances; (all within, the worst step said in words, the worst ratios)."""
    ref = [r for r in ref if "event" not in r]
    got = [r for r in got if "event" not in r]
    if [r["step"] for r in ref] != [r["step"] for r in got]:
        return False, f"steps differ: {[r['step'] for r in got]} against {[r['step'] for r in ref]}", {}
    worst = {}
    for k in keys:
        devs = [abs(b[k] - a[k]) / max(abs(a[k]), 1e-12) for a, b in zip(ref, got) if a.get(k) is not None]
        worst[k] = max(devs) if devs else None
    bad = [k for k in keys if worst[k] is not None and worst[k] > tol.get(k, tol["loss"])]
    words = ", ".join(f"{k} within {100 * worst[k]:.3g}%" for k in keys if worst[k] is not None)
    if bad:
        allowed = ", ".join(f"{100 * tol.get(k, tol['loss']):g}%" for k in bad)
        return False, (f"{len(got)} steps: {', '.join(bad)} off by up to {100 * max(worst[k] for k in bad):.3g}% "
                       f"(allowed {allowed})"), worst
    return True, f"{len(got)} steps, {words}", worst


def _reference(ctx: Context, key: str, files: dict, steps: int, flags: list[str], timeout: float) -> list[dict]:
    """The one-rank run a multi-rank line reproduces, run once per key and shared."""
    if key not in ctx.shared:
        ctx.shared[key] = worker(ctx, ctx.scratch / f"ref-{key}", common_flags(ctx, files, steps, flags), 1,
                                 timeout, f"{key}: one rank")
    return ctx.shared[key]


def _dense(ctx: Context) -> tuple[dict, int, list[str]]:
    """The dense curve's data, steps and flags: full fine-tuning, 8 records a step in rows of one record."""
    files = _records_files(ctx, "dense", (60, 120) if ctx.cpu else (300, 1500), 8 * 8)
    row = str(files["max_len"])
    lr = "1e-3" if ctx.cpu else "1e-5"
    return files, 6 if ctx.cpu else 8, ["--learning_rate", lr, "--packing_tokens", row]


def zero_curve(stage: int) -> Callable[[Context], Result]:
    def run(ctx: Context) -> Result:
        files, steps, flags = _dense(ctx)
        n = ctx.ranks
        ref = _reference(ctx, "dense", files, steps, flags + ["--per_device_train_batch_size", "8"], 300)
        got = worker(ctx, ctx.scratch / f"zero{stage}", common_flags(ctx, files, steps, flags + [
            "--per_device_train_batch_size", str(8 // n), "--deepspeed", f"builtin:zero{stage}"]), n, 300,
            f"zero{stage}: {n} ranks")
        start = got[0]
        if start.get("zero_stage") != stage or start.get("world_size") != n:
            raise LineFailed(f"the run says ZeRO-{start.get('zero_stage')} on {start.get('world_size')} ranks")
        ok, words, worst = compare(ref, got, TOL[ctx.kind])
        return Result(f"zero{stage}-curve", "", "pass" if ok else "fail", f"ZeRO-{stage} on {n} {ctx.kind.upper()}s "
                      f"against 1: {words}", measured={"ranks": n, "worst_relative": worst,
                                                       "loss": [r["loss"] for r in got if "event" not in r]})
    return run


def moe_zero3(ctx: Context) -> Result:
    files = _records_files(ctx, "moe", (60, 120) if ctx.cpu else (300, 1000), 4 * 8, moe=True)
    steps = 6 if ctx.cpu else 8
    flags = ["--learning_rate", "1e-3" if ctx.cpu else "1e-5", "--packing_tokens", str(files["max_len"])]
    n = ctx.ranks
    ref = _reference(ctx, "moe", files, steps, flags + ["--per_device_train_batch_size", "4"], 300)
    got = worker(ctx, ctx.scratch / "moe-zero3", common_flags(ctx, files, steps, flags + [
        "--per_device_train_batch_size", str(4 // n), "--deepspeed", "builtin:zero3"]), n, 400, f"moe: {n} ranks")
    log = ctx.shared.get(f"output:moe: {n} ranks", "")
    leaves = next((ln.split("each gathered whole):", 1)[1].strip() for ln in log.splitlines()
                   if "ZeRO-3 leaf modules" in ln), "")
    if "SparseMoeBlock" not in leaves:
        raise LineFailed(f"no sparse MoE block among ZeRO-3's leaf modules (the log says: {leaves or 'nothing'})")
    ok, words, worst = compare(ref, got, TOL[ctx.kind], keys=("loss", "aux_loss", "grad_norm"))
    return Result("moe-zero3", "", "pass" if ok else "fail", f"{n} ranks, leaf modules {leaves}; against 1: {words}",
                  measured={"ranks": n, "leaf_modules": leaves, "worst_relative": worst,
                            "experts": (got[0].get("moe") or {}).get("experts")})


def sequence_parallel(ctx: Context) -> Result:
    # records longer than half a row: every one is cut between the two ranks of the group
    files = _records_files(ctx, "long", (400, 600) if ctx.cpu else (5000, 7800), 2 * 8)
    row = 640 if ctx.cpu else 8192
    steps = 6 if ctx.cpu else 8
    flags = ["--learning_rate", "1e-3" if ctx.cpu else "1e-5", "--packing_tokens", str(row), "--model_max_length",
             str(row), "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "2"]
    ref = _reference(ctx, "long", files, steps, flags, 300)
    got = worker(ctx, ctx.scratch / "sp2", common_flags(ctx, files, steps, flags + [
        "--sequence_parallel_size", "2", "--deepspeed", "builtin:zero2"]), 2, 400, "sequence parallel: 2 ranks")
    if got[0].get("sequence_parallel_size") != 2:
        raise LineFailed(f"the run says sequence_parallel_size {got[0].get('sequence_parallel_size')}")
    ok, words, worst = compare(ref, got, TOL[ctx.kind])
    return Result("sequence-parallel", "", "pass" if ok else "fail",
                  f"Ulysses over 2 ranks, records of {files['max_len']} tokens at most in rows of {row}; against "
                  f"one rank: {words}", measured={"worst_relative": worst, "row_tokens": row})


def sharded_4bit(ctx: Context) -> Result:
    """Q-LoRA under ZeRO-3: the nf4 base partitioned over the ranks (each holds about 1/N of it), the curve one
    rank's. On GPUs the random weights are written first: Q-LoRA quantizes what it loads."""
    n = ctx.ranks
    if ctx.cpu:
        model = "builtin:tiny"
        files = dict(_records_files(ctx, "dense", (60, 120), 64))
    else:
        files = dict(_records_files(ctx, "dense", (300, 1500), 64))
        model = str(ctx.scratch / "qlora-model")
        if not (Path(model) / "model.safetensors").is_file():
            import shutil

            shutil.copytree(files["model"], model, dirs_exist_ok=True)
            res = ctx.run([sys.executable, str(BENCH / "train_speed.py"), "--save-random", model, "--shape", GPU_SHAPE],
                          timeout=200, env=ctx.line_env(CUDA_VISIBLE_DEVICES=ctx.devices(ctx.gpu_ids[:1])),
                          what="4-bit: random weights")
            if res.returncode != 0:
                raise LineFailed(f"writing the random weights failed: {tail(res.stdout)}")
    files.update(model=model, random_init=False)
    steps = 6
    flags = ["--q_lora", "--use_lora", "--lora_r", "16", "--lora_alpha", "32", "--lora_dropout", "0",
             "--learning_rate", "5e-3" if ctx.cpu else "1e-4", "--packing_tokens", str(files["max_len"])]
    ref = _reference(ctx, "qlora", files, steps, flags + ["--per_device_train_batch_size", "8"], 400)
    got = worker(ctx, ctx.scratch / "qlora-zero3", common_flags(ctx, files, steps, flags + [
        "--per_device_train_batch_size", str(8 // n), "--deepspeed", "builtin:zero3"]), n, 400, f"4-bit: {n} ranks")
    part = got[0].get("base_partition") or {}
    shares = [h / part["total"] for h in part.get("held_by_rank", [])] if part.get("total") else []
    if len(shares) != n or any(abs(s - 1 / n) > 0.05 for s in shares):
        raise LineFailed(f"the 4-bit base is not split over the {n} ranks: {part}")
    ok, words, worst = compare(ref, got, TOL[ctx.kind] if not ctx.cpu else {"loss": 2e-3, "grad_norm": 2e-2},
                               keys=("loss",))
    return Result("sharded-4bit", "", "pass" if ok else "fail",
                  f"nf4 base over {n} ranks, shares {', '.join(f'{s:.1%}' for s in shares)}; against one rank: "
                  f"{words}", measured={"shares": shares, "worst_relative": worst})
