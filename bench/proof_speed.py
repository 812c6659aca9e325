"""The GPU proof's speed lines: the fast path's tokens/s and MFU on one GPU, measured by the existing benchmarks
(bench/train_speed.py, moe_speed.py, long_context.py), beside the figure the README states, read from the
bench/results file it cites; `slow` when more than 10% under it. DPO's line has no stated figure yet: it passes
when it runs with finite losses, and says its tokens/s beside SFT's (this call's speed-7b-lora line, else the
stated one)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from proof_common import BENCH, SLOW_BELOW, Context, LineFailed, Result
from proof_scaling import _gpu_name


def reference(file: str, pick: Callable[[dict], dict | None], rate: str, mfu: str) -> dict:
    """A figure the README states, read from the bench/results file it cites, with the GPU it was measured on
    (the file's own record of it, else the GPU its name carries)."""
    data = json.loads((BENCH / "results" / file).read_text())
    rec = pick(data)
    if rec is None:
        raise ValueError(f"{file}: the cited result is not there")
    gpu = (data.get("env") or {}).get("gpu") or next((f"NVIDIA {g}" for g in ("H200", "H100", "B200", "A100")
                                                       if f"-{g}" in file), None)
    return {"file": f"bench/results/{file}", "tokens_per_s": rec[rate], "mfu": rec.get(mfu), "gpu": gpu}


def other_gpu(here: str, stated: str | None) -> bool:
    """Whether this GPU is not the one the stated figure was measured on (H100 80GB HBM3 is not H200)."""
    return bool(stated) and not here.startswith(str(stated))


def _by(key: str, value: Any) -> Callable[[dict], dict | None]:
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
             + (f", more than {1 - SLOW_BELOW:.0%} under" if v == "slow" else "") + f" on {_gpu_name()}"
             + (f" (the stated figure is an {ref['gpu']}'s: another GPU, so the ratio is not a regression by itself)"
                if other_gpu(_gpu_name(), ref.get("gpu")) else ""))
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


SFT_LINE = "speed-7b-lora"


def _sft_beside(ctx: Context) -> dict:
    """SFT's figure to set DPO's beside: this call's speed-7b-lora line (run before it, in a process of its own,
    which leaves its result in the scratch folder), else the figure the README states."""
    f = ctx.scratch / f"result-{SFT_LINE}.json"
    if f.is_file():
        d = json.loads(f.read_text())
        m = d.get("measured") or {}
        if d.get("verdict") in ("pass", "slow") and m.get("tokens_per_s"):
            return {"tokens_per_s": m["tokens_per_s"], "mfu": m.get("mfu"), "source": f"this call's {SFT_LINE}"}
    ref = reference(*REFERENCES[SFT_LINE])
    return {"tokens_per_s": ref["tokens_per_s"], "mfu": ref["mfu"], "source": f"stated in {ref['file']}"}


def dpo_speed_result(r: dict, sft: dict) -> Result:
    """DPO's verdict: pass when the run finished with finite losses (no stated figure to be slow against yet)."""
    line = "speed-7b-lora-dpo"
    if r.get("status") != "ok":
        raise LineFailed(f"{r.get('status')}: {str(r.get('error', ''))[:400]}")
    got, m = r["tokens_per_s"], r.get("mfu")
    ratio = got / sft["tokens_per_s"]
    epoch, em = r.get("epoch_tokens_per_s"), r.get("epoch_mfu")
    words = (f"{got:,.0f} tokens/s (chosen + rejected tokens)" + (f", MFU {m:.1%}" if m else "")
             + f": {ratio:.2f}x SFT's {sft['tokens_per_s']:,.0f} ({sft['source']})")
    if epoch:
        words += (f"; with the reference pass counted in (a forward a pair once before step 1, "
                  f"{r['reference_tokens_per_s']:,.0f} tokens/s): {epoch:,.0f} tokens/s"
                  + (f", MFU {em:.1%}" if em else "") + f", {epoch / sft['tokens_per_s']:.2f}x SFT's")
    losses = r.get("losses") or []
    finite = bool(losses) and r.get("losses_finite")
    words += (f"; loss {losses[0]:.4f} -> {losses[-1]:.4f}" if finite else f"; a loss is not finite: {losses}")
    words += f" on {_gpu_name()}"
    measured = {"tokens_per_s": got, "mfu": m, "ratio_to_sft": ratio, "epoch_tokens_per_s": epoch, "epoch_mfu": em,
                "epoch_ratio_to_sft": epoch / sft["tokens_per_s"] if epoch else None,
                "reference_tokens_per_s": r.get("reference_tokens_per_s"), "sft": sft, "gpu": _gpu_name(), "run": r}
    return Result(line, "", "pass" if finite else "fail", words, measured=measured, reference=None)


def speed_dpo(ctx: Context) -> Result:
    sys.path.insert(0, str(BENCH))
    import train_speed

    name = "ours-lora-7b-dpo"
    base, cfg, env, extra = train_speed.config_of(name)
    args = _speed_args(ctx)
    _one_gpu_env(ctx)
    r = train_speed.run_ours_worker(name, cfg, args, ctx.log, {**env, "CUDA_VISIBLE_DEVICES": ctx.devices(ctx.gpu_ids[:1])},
                                    extra)
    return dpo_speed_result(r, _sft_beside(ctx))
