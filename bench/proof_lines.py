"""The lines of the GPU proof (bench/gpu_proof.py): what each one runs, on how many GPUs, and its verdict.

A line is a function of the proof's context that returns a Result: pass, fail, slow (a speed more than 10% under
the figure the README states) or skipped, with the reason. Every multi-process line also runs on CPU ranks
(gloo, the tiny built-in models) with --cpu, which is how the suite tests the proof; the lines that only a GPU
can answer (NCCL's transport, speeds, the estimator's scaling on GPUs) then say why they were skipped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
VERDICTS = ("pass", "fail", "slow", "skipped")
SLOW_BELOW = 0.90  # a speed under 90% of the README's figure is flagged

# A small real-shaped model for the curve lines on GPUs: Qwen2.5-0.5B's public config.json (bench/train_speed.py
# builds it from SHAPES), random-init; on CPU the tiny built-in models.
GPU_SHAPE = "0.5b"
# Tolerances of a multi-GPU curve against one GPU's, step by step. On CPU (fp32) the suite's own; on GPUs the runs
# are bf16 under autocast with fp32 master weights, and the ranks' rows are packed differently, so the sums run in
# another order: looser, and to be confirmed by the first GPU call.
TOL = {"cpu": {"loss": 1e-3, "grad_norm": 1e-3}, "gpu": {"loss": 2e-2, "grad_norm": 5e-2}}


@dataclass
class Result:
    line: str
    title: str
    verdict: str
    detail: str
    measured: dict = field(default_factory=dict)
    reference: Optional[dict] = None
    seconds: float = 0.0
    gpus: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {VERDICTS}")
        if self.verdict == "skipped" and not self.detail:
            raise ValueError(f"{self.line}: a skipped line must say why")

    def to_dict(self) -> dict:
        return {"line": self.line, "title": self.title, "verdict": self.verdict, "detail": self.detail,
                "measured": self.measured, "reference": self.reference, "seconds": round(self.seconds, 1),
                "gpus": self.gpus}


class LineFailed(Exception):
    """A line's run broke: its message is the verdict's detail."""


@dataclass
class Line:
    name: str
    title: str
    gpus: int  # GPUs it needs: 1, 2, or 0 for all of them (at least 2)
    gpu_only: bool  # True: needs CUDA; False: also runs on CPU ranks (--cpu)
    est_s: float  # seconds on an H200 machine, for the budget
    run: Callable[["Context"], Result]
    needs: tuple[str, ...] = ()  # modules it imports in the worker (a missing one skips it, naming the wheel)
    after: tuple[str, ...] = ()  # lines whose results it reads

    def want(self, total: int) -> int:
        return total if self.gpus == 0 else self.gpus


@dataclass
class Context:
    out: Path
    scratch: Path
    cpu: bool  # CPU ranks (gloo) instead of GPUs
    ngpus: int  # GPUs on the machine (0 with --cpu)
    deadline: float  # time.monotonic() by which everything must be done
    env: dict  # the environment every process of the proof gets
    log: Path
    results: dict = field(default_factory=dict)  # line name -> Result, as they finish
    shared: dict = field(default_factory=dict)  # what lines share (the one-rank reference runs, the nodes)
    gpu_ids: list[int] = field(default_factory=list)  # the GPUs of the line running now (set per line)
    carry: Optional[Path] = None
    visible: list[str] = field(default_factory=list)  # the CUDA_VISIBLE_DEVICES the proof was given (empty: all)

    @property
    def ranks(self) -> int:
        """Processes a multi-process line runs: its GPUs, or 2 CPU ranks."""
        return 2 if self.cpu else len(self.gpu_ids)

    @property
    def kind(self) -> str:
        return "cpu" if self.cpu else "gpu"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def devices(self, ids: Optional[list[int]] = None) -> str:
        """CUDA_VISIBLE_DEVICES for these of the proof's GPUs (default the line's), through the one it was given."""
        ids = self.gpu_ids if ids is None else ids
        return ",".join(self.visible[i] if self.visible else str(i) for i in ids)

    def line_env(self, **extra: str) -> dict:
        env = dict(self.env)
        if not self.cpu:
            env["CUDA_VISIBLE_DEVICES"] = self.devices()
        env.update(extra)
        return env

    def run(self, argv: list[str], *, timeout: float, env: Optional[dict] = None, cwd: Path = ROOT,
            what: str = "", stdout_only: bool = False) -> subprocess.CompletedProcess:
        """Runs a command in its own session, its output appended to the proof's log (stdout_only: its stderr goes
        to the log alone, and stdout is what it printed there); on the timeout (or past the deadline) the whole
        session is killed and the line fails, saying so."""
        limit = max(5.0, min(timeout, self.left()))
        with open(self.log, "a") as log:
            log.write(f"===== {what or argv[0]}: {' '.join(argv)}\n")
            log.flush()
            p = subprocess.Popen(argv, cwd=cwd, env=env or self.line_env(), stdout=subprocess.PIPE,
                                 stderr=log if stdout_only else subprocess.STDOUT, text=True, start_new_session=True)
            try:
                out, _ = p.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate(timeout=30)
                log.write(out or "")
                raise LineFailed(f"{what or argv[0]} did not finish within {limit:.0f} s") from None
            log.write(out or "")
        return subprocess.CompletedProcess(argv, p.returncode, out or "", "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(ctx: Context, nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port())]


def tail(text: str, n: int = 3) -> str:
    return " | ".join(x.strip() for x in text.strip().splitlines()[-n:])[-500:]


# ------------------------------------------------------------------ the worker on a small model, any number of ranks


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


# ------------------------------------------------------------------ collectives and the estimator


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
                   base_tokens_per_s: Optional[float] = None) -> Optional[dict]:
    """The estimator's weak-scaling efficiency from 1 to n GPUs of one node for the scaling line's workload, with
    the measured intra-node bus bandwidth and with its GPU table's. As bench/multinode_calibration.py does, the
    compute speed is the one measured on one GPU where there is one (else the worker path's own figure). GPUs
    only: on CPU ranks it models nothing."""
    if ctx.cpu:
        return None
    sys.path.insert(0, str(ROOT))
    from qwen_tui.model.spec import known_spec
    from qwen_tui.plan.estimate import GPUS, RunShape, estimate_step, flops_per_token, gpu_spec

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


# ------------------------------------------------------------------ two nodes over SSH: check, transport, launcher


def nodes(ctx: Context):
    """Two sshd "nodes" for this line, each with half of the line's GPUs (bench/proof_sshd.py); None (and the
    reason in ctx.shared["nodes_why"]) where no sshd can be had. The caller takes them down."""
    sys.path.insert(0, str(BENCH))
    import proof_sshd

    sshd, how = proof_sshd.find_sshd(ctx.carry, ctx.scratch)
    if sshd is None:
        ctx.shared["nodes_why"] = how
        return None
    half = max(1, len(ctx.gpu_ids) // 2)
    keep = ("PYTHONPATH", "QWEN_TUI_CACHE", "TORCH_EXTENSIONS_DIR", "HF_HUB_OFFLINE", "NCCL_NVLS_ENABLE",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "PATH")
    base = {k: ctx.env[k] for k in keep if ctx.env.get(k)}
    node_env = []
    for i in range(2):
        e = dict(base)
        if not ctx.cpu:
            e["CUDA_VISIBLE_DEVICES"] = ctx.devices(ctx.gpu_ids[i * half:(i + 1) * half])
        node_env.append(e)
    n = proof_sshd.up(sshd, ctx.scratch / f"sshd-{'-'.join(map(str, ctx.gpu_ids)) or 'cpu'}-{time.monotonic_ns()}",
                      node_env)
    n.how = how
    n.gpus = [e.get("CUDA_VISIBLE_DEVICES", "") for e in node_env]
    return n


def two_node_preset(ctx: Context, n, name: str, **training: Any) -> Path:
    import yaml

    per = 1 if ctx.cpu else max(1, len(ctx.gpu_ids) // 2)
    work = [ctx.scratch / f"{name}-node-{i}" for i in range(2)]
    for w in work:
        w.mkdir(parents=True, exist_ok=True)
    preset = {
        "name": f"gpu-proof-{name}",
        "cluster": {"nodes": [{"host": h, "gpus": per, "workdir": str(w), "python": sys.executable}
                              for h, w in zip(n.hosts, work)],
                    "ssh_config": str(n.ssh_config), "known_hosts": str(n.known_hosts),
                    "identity_file": str(n.identity), "connect_timeout": 10},
        # both "nodes" are this machine: the master is reached on the loopback, as NCCL's and gloo's sockets are
        "network": {"master_addr": "127.0.0.1", "master_port": free_port(), "interface": "lo", "rdzv_timeout": 60},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "method": "lora", "zero_stage": None,
                     "device": "cpu" if ctx.cpu else "cuda", "precision": "fp32" if ctx.cpu else "bf16",
                     "max_steps": 6, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1,
                     "model_max_length": 128, "gradient_checkpointing": False, "lora_r": 8, "save_strategy": "no",
                     "output_dir": str(ctx.scratch / f"{name}-output"), **training},
    }
    if not ctx.cpu:
        # NCCL between two agents of one host would use P2P or shared memory; with both off it takes the network
        # path it takes between machines, so the rehearsal's transport verdict reads a real NET line.
        preset["network"]["env"] = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"} if name == "check" else {}
    p = ctx.scratch / f"{name}.yaml"
    p.write_text(yaml.safe_dump(preset, sort_keys=False))
    return p


def with_nodes(line: str, body: Callable[[Context, Any], Result]) -> Callable[[Context], Result]:
    """The line's body on two sshd nodes of its own, taken down however it ends; skipped where no sshd is."""
    def run(ctx: Context) -> Result:
        n = nodes(ctx)
        if n is None:
            return Result(line, "", "skipped", ctx.shared["nodes_why"])
        try:
            return body(ctx, n)
        finally:
            n.down()
    return run


def _check(ctx: Context, n) -> Result:
    preset = two_node_preset(ctx, n, "check")
    res = ctx.run([sys.executable, "-m", "qwen_tui", "check", str(preset), "--json", "--accept-new-host-keys",
                   "--bandwidth-seconds", "1"], timeout=240, what="qwen-tui check", stdout_only=True)
    try:
        rep = json.loads(res.stdout)
    except ValueError:
        raise LineFailed(f"qwen-tui check printed no report (exit {res.returncode}): {tail(res.stdout)}") from None
    ctx.shared["check"] = rep
    errors = [f"{f.get('code')}: {f.get('message')}" for f in rep["findings"] if f.get("level") == "error"]
    rehearsal = [f for f in rep["findings"] if f.get("code") == "REHEARSAL"]
    if res.returncode != 0 or not rehearsal:
        return Result("check", "", "fail", "; ".join(errors)[:600] or f"exit {res.returncode}, no rehearsal verdict",
                      measured={"ok": rep.get("ok")})
    return Result("check", "", "pass", f"2 nodes over SSH ({n.how} sshd), every check ok; "
                  f"rehearsal: {rehearsal[0]['message']}",
                  measured={"matrix": rep["matrix"], "rehearsal": rehearsal[0]["message"],
                            "seconds": rep.get("seconds")})


def nccl_transport(ctx: Context) -> Result:
    rep = ctx.shared.get("check")
    if rep is None:
        return Result("nccl-transport", "", "skipped", "the check line gave no report to read")
    nets = {f.get("node"): f["message"] for f in rep["findings"] if f.get("code") in ("NCCL_NETWORK",
                                                                                      "NCCL_SOCKET_FALLBACK")}
    named = {k: v for k, v in nets.items() if "NET/" in v}
    ok = len(named) == 2
    return Result("nccl-transport", "", "pass" if ok else "fail",
                  "; ".join(v for _, v in sorted(nets.items(), key=lambda kv: str(kv[0])))
                  or "the check said nothing of NCCL's network", measured={"findings": nets})


def _gpu_of_pids() -> dict[int, str]:
    """pid -> the UUID of the GPU it computes on (nvidia-smi's compute apps), {} where nvidia-smi cannot say."""
    try:
        q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for ln in q.stdout.splitlines():
        parts = [x.strip() for x in ln.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            out[int(parts[0])] = parts[1]
    return out


def _launcher(ctx: Context, n) -> Result:
    """`qwen-tui replay` of a preset with two nodes reached over SSH: two torchrun agents, each with its GPUs;
    the run must end COMPLETED with every rank, and (on GPUs) the two nodes' ranks on different GPUs."""
    preset = two_node_preset(ctx, n, "launch")
    runs = ctx.scratch / "launch-runs"
    argv = [sys.executable, "-m", "qwen_tui", "replay", str(preset), "--skip-checks", "--accept-new-host-keys",
            "--runs-dir", str(runs), "--max-seconds", "240"]
    seen: dict[int, str] = {}
    with open(ctx.log, "a") as log:
        log.write(f"===== launcher: {' '.join(argv)}\n")
        log.flush()
        p = subprocess.Popen(argv, cwd=ctx.scratch, env=ctx.line_env(COLUMNS="160"), stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        limit = time.monotonic() + max(5.0, min(300.0, ctx.left()))
        while p.poll() is None:
            if time.monotonic() > limit:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
                raise LineFailed("qwen-tui replay did not finish in time")
            if not ctx.cpu:
                seen.update(_gpu_of_pids())
            time.sleep(1.0)
    metrics = sorted((ctx.scratch / "launch-node-0").glob(".qwen-tui/runs/*/metrics.jsonl"))
    recs = [json.loads(x) for x in metrics[-1].read_text().splitlines()] if metrics else []
    start = next((r for r in recs if r.get("event") == "start"), {})
    end = next((r for r in recs if r.get("event") == "end"), {})
    beats = {}
    for i in range(2):
        for f in (ctx.scratch / f"launch-node-{i}").glob(".qwen-tui/runs/*/heartbeat/rank-*.json"):
            b = json.loads(f.read_text())
            beats[b["rank"]] = b
    world = 2 * (1 if ctx.cpu else max(1, len(ctx.gpu_ids) // 2))
    problems = []
    if p.returncode != 0:
        problems.append(f"replay exited {p.returncode}")
    if start.get("world_size") != world:
        problems.append(f"world size {start.get('world_size')}, not {world}")
    if sorted(beats) != list(range(world)) or {b["node_rank"] for b in beats.values()} != {0, 1}:
        problems.append(f"heartbeats from ranks {sorted(beats)} of nodes {sorted({b['node_rank'] for b in beats.values()})}")
    gpus_by_node: dict[int, set] = {}
    if not ctx.cpu:
        for b in beats.values():
            if b["pid"] in seen:
                gpus_by_node.setdefault(b["node_rank"], set()).add(seen[b["pid"]])
        if len(gpus_by_node) == 2 and gpus_by_node[0] & gpus_by_node[1]:
            problems.append(f"the nodes' ranks shared a GPU: {gpus_by_node}")
    measured = {"world_size": start.get("world_size"), "end": end, "node_gpus": n.gpus,
                "gpu_uuids_by_node": {k: sorted(v) for k, v in gpus_by_node.items()}}
    if problems:
        return Result("launcher", "", "fail", "; ".join(problems) + f" (log: {ctx.log.name})", measured=measured)
    where = "" if ctx.cpu else (f", node GPUs {' and '.join(n.gpus)}" +
                                (" (seen on different GPUs)" if len(gpus_by_node) == 2 else ""))
    return Result("launcher", "", "pass", f"replay over SSH to 2 nodes, {world} ranks, {len(beats)} heartbeats, "
                  f"ended {end.get('status', end.get('state', 'ok'))}{where}", measured=measured)


# ------------------------------------------------------------------ speeds on one GPU beside the README's figures


def reference(file: str, pick: Callable[[dict], Optional[dict]], rate: str, mfu: str) -> dict:
    """A figure the README states, read from the bench/results file it cites."""
    data = json.loads((BENCH / "results" / file).read_text())
    rec = pick(data)
    if rec is None:
        raise ValueError(f"{file}: the cited result is not there")
    return {"file": f"bench/results/{file}", "tokens_per_s": rec[rate], "mfu": rec.get(mfu)}


def _by(key: str, value: Any) -> Callable[[dict], Optional[dict]]:
    return lambda d: next((r for r in d["results"] if r.get(key) == value), None)


# What the README states, with the file its table cites: the same configuration as the line runs.
REFERENCES: dict[str, tuple[str, Callable, str, str]] = {
    "speed-7b-lora": ("train_speed-2026-11-30-H200-run19.json", _by("config", "ours-lora-7b"), "tokens_per_s", "mfu"),
    "speed-1.5b-full": ("train_speed-2026-11-30-H200-run19.json", _by("config", "ours-full-1.5b"), "tokens_per_s",
                        "mfu"),
    "speed-moe-lora": ("moe_speed-2026-12-02-H200-run2.json", _by("recipe", "ours"), "tokens_per_s", "mfu_active"),
    "speed-longest-record": ("long_context-2026-12-02-H200.json", _by("length", 196608), "tokens_per_s", "mfu"),
}


def verdict_of_speed(measured: float, ref: float) -> str:
    return "pass" if measured >= SLOW_BELOW * ref else "slow"


def _speed_result(line: str, r: dict, rate: str = "tokens_per_s", mfu: str = "mfu") -> Result:
    ref = reference(*REFERENCES[line])
    if r.get("status") != "ok":
        raise LineFailed(f"{r.get('status')}: {str(r.get('error', ''))[:400]}")
    got, m = r[rate], r.get(mfu)
    ratio = got / ref["tokens_per_s"]
    v = verdict_of_speed(got, ref["tokens_per_s"])
    words = (f"{got:,.0f} tokens/s" + (f", MFU {m:.1%}" if m else "") + f" against {ref['tokens_per_s']:,.0f}"
             + (f" ({ref['mfu']:.1%})" if ref.get("mfu") else "") + f" stated: {ratio:.2f}x"
             + (f", more than {1 - SLOW_BELOW:.0%} under" if v == "slow" else "") + f" on {_gpu_name()}")
    return Result(line, "", v, words, measured={"tokens_per_s": got, "mfu": m, "ratio": ratio,
                                                "gpu": _gpu_name(), "run": r}, reference=ref)


def _speed_args(ctx: Context, **kw: Any) -> SimpleNamespace:
    base = dict(steps=6, warmup=2, records_per_step=64, mem_fraction=0.90, max_tokens=49152, tokens=0,
                tmp=str(ctx.scratch / "speed"), timeout=max(60.0, ctx.left() - 10), no_compile=False,
                no_liger=False, worker_profile=False, worker_trace=False, shape=None, keep_input_dtype=False)
    base.update(kw)
    return SimpleNamespace(**base)


def _one_gpu_env(ctx: Context):
    """This process's environment for a speed line (which runs in a process of its own): the proof's, one GPU."""
    os.environ.update({k: v for k, v in ctx.env.items() if k != "CUDA_VISIBLE_DEVICES"})
    os.environ["CUDA_VISIBLE_DEVICES"] = ctx.devices(ctx.gpu_ids[:1])


def speed_train(config: str, line: str) -> Callable[[Context], Result]:
    def run(ctx: Context) -> Result:
        sys.path.insert(0, str(BENCH))
        import train_speed

        base, cfg, env, extra = train_speed.config_of(config)
        args = _speed_args(ctx)
        _one_gpu_env(ctx)  # the benchmark starts from this process's environment and logs only what it adds
        r = train_speed.run_ours_worker(config, cfg, args, ctx.log,
                                        {**env, "CUDA_VISIBLE_DEVICES": ctx.devices(ctx.gpu_ids[:1])}, extra)
        return _speed_result(line, r)
    return run


def speed_moe(ctx: Context) -> Result:
    sys.path.insert(0, str(BENCH))
    import moe_speed

    args = _speed_args(ctx, shape="30b-a3b", steps=4, warmup=2, worker_flags="", cpu_smoke=False,
                       tmp=str(ctx.scratch / "moe-speed"))
    args.records = (args.warmup + args.steps) * args.records_per_step
    _one_gpu_env(ctx)
    r = moe_speed.run_ours(args, ctx.out)
    recs = moe_speed.make_records(args.records, moe_speed.SHAPES[args.shape]["vocab_size"])
    s = sum(len(i) ** 2 for i, _ in recs) / sum(len(i) for i, _ in recs)
    if r.get("status") == "ok":
        f, _ = moe_speed.flops_per_token(args.shape, s)
        r["mfu_active"] = r["tokens_per_s"] * f / (moe_speed.PEAK_TFLOPS * 1e12)
    return _speed_result("speed-moe-lora", r, mfu="mfu_active")


def speed_longest(ctx: Context) -> Result:
    sys.path.insert(0, str(BENCH))
    import long_context

    args = SimpleNamespace(cpu_smoke=False, tmp=str(ctx.scratch / "long"), worker_args=[])
    _one_gpu_env(ctx)
    r = long_context.run_length(196608, 1, 0, args, ctx.log, timeout=max(60.0, ctx.left() - 10))
    return _speed_result("speed-longest-record", r)


# ------------------------------------------------------------------ the table of lines, in the order they run

LINES: list[Line] = [
    Line("collectives", "NCCL all-reduce / all-gather bus bandwidth, fed to the estimator", 0, False, 40,
         collectives),
    Line("check", "`qwen-tui check` on two nodes over SSH, with its rehearsal", 2, False, 60,
         with_nodes("check", _check), needs=("paramiko",)),
    Line("nccl-transport", "the rehearsal's NCCL transport verdict (NET/IB or NET/Socket)", 2, True, 1,
         nccl_transport, after=("check",)),
    Line("launcher", "qwen-tui's launcher: two torchrun agents over SSH, each with its GPUs", 2, False, 90,
         with_nodes("launcher", _launcher), needs=("paramiko",)),
    Line("zero2-curve", "ZeRO-2 on 2 GPUs reproduces 1 GPU's loss and grad-norm curve", 2, False, 100,
         zero_curve(2), needs=("deepspeed",)),
    Line("zero3-curve", "ZeRO-3 on 2 GPUs reproduces 1 GPU's loss and grad-norm curve", 2, False, 60,
         zero_curve(3), needs=("deepspeed",)),
    Line("moe-zero3", "MoE under ZeRO-3 with leaf modules reproduces 1 GPU's curve", 2, False, 120, moe_zero3,
         needs=("deepspeed",)),
    Line("sequence-parallel", "sequence parallelism 2 reproduces one GPU's loss", 2, False, 110, sequence_parallel,
         needs=("deepspeed",)),
    Line("sharded-4bit", "the 4-bit base sharded by ZeRO-3 (Q-LoRA)", 2, False, 120, sharded_4bit,
         needs=("deepspeed", "bitsandbytes")),
    Line("scaling", "scaling efficiency 1 -> N GPUs beside the estimator's prediction", 0, True, 150, scaling,
         needs=("deepspeed",), after=("collectives",)),
    Line("speed-7b-lora", "fast path: Qwen2.5-7B LoRA tokens/s and MFU", 1, True, 130,
         speed_train("ours-lora-7b", "speed-7b-lora"), needs=("liger_kernel",)),
    Line("speed-1.5b-full", "fast path: Qwen2.5-1.5B full tokens/s and MFU", 1, True, 70,
         speed_train("ours-full-1.5b", "speed-1.5b-full"), needs=("liger_kernel",)),
    Line("speed-moe-lora", "fast path: Qwen3-30B-A3B-shape LoRA tokens/s and MFU", 1, True, 130, speed_moe,
         needs=("liger_kernel",)),
    Line("speed-longest-record", "the longest single record (196,608 tokens, 7B LoRA) tokens/s and MFU", 1, True,
         160, speed_longest),
]
