"""FP8 against bf16 on one GPU, for qwen-tui's shapes: does torchao's float8 training pay here?

    python bench/fp8_speed.py --out DIR                      # the cases that fit --budget-s (one GPU, sm_89+)
    python bench/fp8_speed.py --cases lora-7b --out DIR      # some of them
    python bench/fp8_speed.py --cpu-smoke --out /tmp/s       # every code path on the tiny shape, no GPU

Each case trains the same random-init Qwen2.5 shape twice in one process, from the same weights on the same
batches: once in bf16, once with torchao's float8 training (convert_to_float8_training, tensorwise scaling,
dynamic casts) on the chosen linears, both with every decoder layer under torch.compile (one graph for all
layers, as the worker compiles them), fused AdamW, no gradient checkpointing. It reports per case:

  tokens/s of each arm over the steps after the warm-up (the warm-up, compile included, is timed apart),
  their ratio, the Linear layers converted, the FP8 matmuls a profiled step ran (aten::_scaled_mm calls and
  their GPU time, beside the GEMM kernels by name; the bf16 arm is the control and must show none), the peak
  memory, and loss parity: the largest relative difference between the two arms' losses over every step.

Cases: lora-7b  the 7B shape, LoRA r=64 alpha=16 (no dropout) on the seven projections of every layer as a
                minimal hand-written adapter (LoRALinear below, not peft): the frozen base linear in FP8, the
                adapter's two small matmuls in bf16; lm_head stays bf16 and frozen.
       full-1.5b the 1.5B shape, full fine-tuning, every linear FP8 except lm_head (tied to the embedding).
       full-7b   the 7B shape, full fine-tuning (bf16 weights, AdamW states in bf16), when the budget allows.

Data: rows of a short random motif (16 tokens from a 2,048-token subset of the vocabulary) repeated to the
row's length, a new motif per row and step, from a seed per step: both arms read identical batches, and the
loss falls as the model learns to copy, so parity is checked on a moving curve rather than a flat one.

MFU uses bench/train_speed.py's formula (k*N + 12*L*h*s per token, k = 4 LoRA, 6 full; s = the row length)
against 989 TFLOP/s dense bf16 for both arms (the FP8 arm's MFU is bf16-equivalent). This is a plain
training loop, not the worker's fast path (no packing, no fused loss, no memory-probed row budget): its
tokens/s are below the worker's own (bench/results/gpu_proof-1xH200-2026-12-05.md); the ratio is what it
measures.

--cpu-smoke runs the tiny shape on the CPU, bf16 against a second bf16 arm (which must match exactly), with
the layers compiled by aot_eager; the FP8 arm is reported skipped with its reason.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import platform
import re
import sys
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from train_speed import PEAK_TFLOPS, SHAPES  # noqa: E402  (bench/ is not a package)

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_R, LORA_ALPHA = 64, 16
MOTIF, SUBSET = 16, 2048
PARITY_LIMIT = 0.02  # largest relative loss difference still called parity
PAYS_AT = 1.05  # FP8 pays when it is at least this much faster and parity holds

# method, shape, rows x row length, learning rate, rough seconds of both arms on an H200 (for the budget)
CASES = {
    "lora-7b": dict(method="lora", shape="7b", rows=8, seq=1024, lr=5e-4, est_s=120),
    "full-1.5b": dict(method="full", shape="1.5b", rows=8, seq=1024, lr=1e-4, est_s=60),
    "full-7b": dict(method="full", shape="7b", rows=4, seq=1024, lr=2e-5, est_s=100),
}
SMOKE_CASES = {
    "lora-tiny": dict(method="lora", shape="tiny", rows=2, seq=64, lr=5e-4, est_s=10),
    "full-tiny": dict(method="full", shape="tiny", rows=2, seq=64, lr=1e-4, est_s=10),
}
# The worker's own bf16 figures on its fast path (bench/results/gpu_proof-1xH200-2026-12-05.md).
WORKER_BF16 = {"lora-7b": (16626, 49.7), "full-1.5b": (55076, 54.5)}
FP8_OP = "aten::_scaled_mm"
FP8_KERNEL_RE = re.compile(r"e4m3|e5m2|fp8|f8f8|qgmma|_scaled_mm", re.I)
GEMM_KERNEL_RE = re.compile(r"gemm|nvjet|cutlass|xmma|gmma|sm90_", re.I)


def fp8_unavailable(torch, smoke: bool) -> str | None:
    """Why the FP8 arm cannot run here, or None."""
    if smoke:
        return "--cpu-smoke: no GPU; FP8 matmuls need an NVIDIA GPU of compute capability 8.9 or newer"
    if not torch.cuda.is_available():
        return "no CUDA device"
    cap = torch.cuda.get_device_capability()
    if cap < (8, 9):
        return f"compute capability {cap[0]}.{cap[1]} has no FP8 tensor cores (8.9+ needed)"
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        return f"torchao is not installed ({e})"
    return None


def make_lora_linear(torch):
    nn = torch.nn

    class LoRALinear(nn.Module):
        """base(x) + B(A(x)) * alpha/r: the base (nn.Linear or torchao's Float8Linear) frozen, A and B in bf16,
        B zero at start (peft's initialisation), no dropout."""

        def __init__(self, base: nn.Module, r: int, alpha: int):
            super().__init__()
            self.base = base
            w = base.weight
            self.lora_A = nn.Parameter(torch.empty(r, w.shape[1], dtype=w.dtype, device=w.device))
            self.lora_B = nn.Parameter(torch.zeros(w.shape[0], r, dtype=w.dtype, device=w.device))
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            self.scale = alpha / r

        def forward(self, x):
            return self.base(x) + (x @ self.lora_A.t()) @ self.lora_B.t() * self.scale

    return LoRALinear


def batch(torch, step: int, rows: int, seq: int, vocab: int, device):
    """Rows of a repeated random motif; identical for both arms (seeded by the step)."""
    g = torch.Generator().manual_seed(1_000_003 + step)
    n = min(SUBSET, vocab // 2)
    subset = torch.randperm(vocab, generator=torch.Generator().manual_seed(7))[:n]
    motifs = subset[torch.randint(0, n, (rows, MOTIF), generator=g)]
    toks = motifs.repeat(1, (seq + 1 + MOTIF - 1) // MOTIF)[:, : seq + 1]
    toks = toks.to(device)
    return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()


def build(torch, case: dict, device, fp8: bool):
    """The case's model in bf16 from seed 0, its LoRA or full set-up, FP8 conversion when asked.
    Returns (model, trainable params, linears converted, matmul parameter count)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**SHAPES[case["shape"]])
    cfg.use_cache = False
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.train()
    emb = model.get_input_embeddings().weight
    n_matmul = sum(p.numel() for p in model.parameters() if p is not emb or cfg.tie_word_embeddings)
    lora = case["method"] == "lora"
    if lora:
        model.requires_grad_(False)
    converted = 0
    if fp8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        from torchao.float8.float8_linear import Float8Linear

        def chosen(mod, fqn: str) -> bool:
            # every decoder linear (all seven projections of every layer); lm_head stays bf16
            return ".layers." in f".{fqn}" and fqn.rsplit(".", 1)[-1] in LORA_TARGETS

        convert_to_float8_training(model, module_filter_fn=chosen,
                                   config=Float8LinearConfig.from_recipe_name("tensorwise"))
        converted = sum(isinstance(m, Float8Linear) for m in model.modules())
    if lora:
        LoRALinear = make_lora_linear(torch)
        torch.manual_seed(1)
        for layer in model.model.layers:
            for parent in (layer.self_attn, layer.mlp):
                for name in LORA_TARGETS:
                    if hasattr(parent, name):
                        setattr(parent, name, LoRALinear(getattr(parent, name), LORA_R, LORA_ALPHA))
    trainable = [p for p in model.parameters() if p.requires_grad]
    return model, trainable, converted, n_matmul


def fingerprint(torch, model) -> float:
    """One number from every weight (the same init in both arms reads the same)."""
    with torch.no_grad():
        s = torch.zeros((), dtype=torch.float64, device=next(model.parameters()).device)
        for i, p in enumerate(model.parameters()):
            s += p.detach().double().sum() * ((i % 7) + 1)
    return float(s)


def profile_step(torch, step_fn, cuda: bool) -> dict:
    """One profiled training step: the FP8 matmul calls and GPU time, and the GEMM kernels by GPU time."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        step_fn()
        if cuda:
            torch.cuda.synchronize()
    out = {"scaled_mm_calls": 0, "scaled_mm_gpu_ms": 0.0, "fp8_kernel_launches": 0, "fp8_kernels": [],
           "gemm_kernels": []}
    gemms = []
    for e in prof.key_averages():
        dev_us = getattr(e, "device_time_total", None)
        if dev_us is None:
            dev_us = getattr(e, "cuda_time_total", 0.0)
        if e.key == FP8_OP:
            out["scaled_mm_calls"] += e.count
            out["scaled_mm_gpu_ms"] += dev_us / 1e3
        is_kernel = getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)
        if is_kernel and FP8_KERNEL_RE.search(e.key):
            out["fp8_kernel_launches"] += e.count
            out["fp8_kernels"].append({"name": e.key[:160], "launches": e.count, "gpu_ms": round(dev_us / 1e3, 3)})
        if is_kernel and GEMM_KERNEL_RE.search(e.key):
            gemms.append({"name": e.key[:160], "launches": e.count, "gpu_ms": round(dev_us / 1e3, 3)})
    out["scaled_mm_gpu_ms"] = round(out["scaled_mm_gpu_ms"], 3)
    out["gemm_kernels"] = sorted(gemms, key=lambda g: -g["gpu_ms"])[:8]
    return out


def run_arm(torch, name: str, case: dict, args, device, fp8: bool) -> dict:
    cuda = device.type == "cuda"
    t0 = time.perf_counter()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model, trainable, converted, n_matmul = build(torch, case, device, fp8)
    fp = fingerprint(torch, model)
    backend = "aot_eager" if args.cpu_smoke else "inductor"
    for layer in model.model.layers:
        layer.compile(backend=backend, dynamic=False)
    opt = torch.optim.AdamW(trainable, lr=case["lr"], weight_decay=0.0, fused=cuda)
    vocab = model.config.vocab_size

    def step(i: int):
        inp, lab = batch(torch, i, case["rows"], case["seq"], vocab, device)
        logits = model(input_ids=inp).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), lab.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    losses = []
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    built_s = time.perf_counter() - t0
    t_w = time.perf_counter()
    for i in range(args.warmup):
        losses.append(step(i))
    sync()
    warm_s = time.perf_counter() - t_w
    t_m = time.perf_counter()
    done = args.warmup
    for i in range(args.warmup, args.steps):
        if time.perf_counter() > args.hard_deadline:
            break  # past the bench's hard deadline: report the steps run so far, cut short
        losses.append(step(i))
        done = i + 1
    sync()
    timed_s = time.perf_counter() - t_m
    tokens = (done - args.warmup) * case["rows"] * case["seq"]
    prof = profile_step(torch, lambda: step(done), cuda)
    cfg = SHAPES[case["shape"]]
    k = 4 if case["method"] == "lora" else 6
    flops_tok = k * n_matmul + 12 * cfg["num_hidden_layers"] * cfg["hidden_size"] * case["seq"]
    tps = tokens / timed_s
    res = {
        "arm": name, "fp8": fp8, "linears_converted": converted, "init_fingerprint": fp,
        "trainable_params": sum(p.numel() for p in trainable), "matmul_params": n_matmul,
        "build_s": round(built_s, 1), "warmup_s": round(warm_s, 1), "timed_s": round(timed_s, 2),
        "timed_steps": done - args.warmup, "cut_short": done < args.steps, "tokens_per_s": round(tps, 1),
        "mfu_bf16_peak_pct": round(100 * tps * flops_tok / (PEAK_TFLOPS * 1e12), 1) if cuda else None,
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None,
        "losses": torch.stack(losses).float().cpu().tolist(),
        "profile": prof,
    }
    model = opt = trainable = losses = None  # free the arm before the next one builds
    gc.collect()
    torch._dynamo.reset()
    if cuda:
        torch.cuda.empty_cache()
    return res


def compare(case_name: str, arms: dict, fp8_key: str) -> dict:
    """Ratio, parity and the verdict of a case from its two arms."""
    a, b = arms["bf16"], arms[fp8_key]
    if "error" in a or "error" in b:
        return {"verdict": "error", "why": a.get("error") or b.get("error")}
    rel = [abs(x - y) / abs(x) for x, y in zip(a["losses"], b["losses"]) if x]
    out = {
        "ratio": round(b["tokens_per_s"] / a["tokens_per_s"], 3),
        "max_rel_loss_diff": max(rel) if rel else None,
        "max_rel_loss_diff_step": rel.index(max(rel)) if rel else None,
        "parity_steps": len(rel),
        "same_init": a["init_fingerprint"] == b["init_fingerprint"],
        # FP8 matmuls per converted linear in one step: 3 = forward, input gradient and weight gradient; 2 = the
        # weight-gradient matmul of a frozen base was left out
        "scaled_mm_per_linear": (round(b["profile"]["scaled_mm_calls"] / b["linears_converted"], 2)
                                 if b["linears_converted"] else None),
        "loss_first_last": [a["losses"][0], a["losses"][-1], b["losses"][0], b["losses"][-1]],
    }
    if fp8_key != "fp8":
        out["verdict"] = "smoke"
        return out
    engaged = b["profile"]["scaled_mm_calls"] > 0 and a["profile"]["scaled_mm_calls"] == 0
    parity = out["max_rel_loss_diff"] is not None and out["max_rel_loss_diff"] <= PARITY_LIMIT
    out["fp8_engaged"] = engaged
    out["parity"] = parity
    out["verdict"] = verdict(engaged, parity, out["ratio"])
    out["auto"] = "on" if out["verdict"] == "fp8 pays" else "off"
    return out


def verdict(engaged: bool, parity: bool, ratio: float) -> str:
    """One case's word: FP8 engaged, the loss held, and how its tokens/s compare with bf16's."""
    if not engaged:
        return "fp8 did not engage"
    if not parity:
        return "loss drifts"
    if ratio >= PAYS_AT:
        return "fp8 pays"
    return "fp8 within noise" if ratio >= 1.0 else "fp8 slower"


def markdown(doc: dict) -> str:
    lines = [f"FP8 against bf16, {doc['date']} on {doc['gpu']}; torch {doc['versions']['torch']}, "
             f"torchao {doc['versions']['torchao']}, transformers {doc['versions']['transformers']}; "
             f"{doc['elapsed_s']:.0f} s of a {doc['budget_s']} s budget; {doc['steps']} steps per arm, "
             f"the first {doc['warmup']} (compile included) untimed", "",
             "| case | tokens/step | bf16 tokens/s (MFU) | FP8 tokens/s (bf16-equiv. MFU) | ratio | linears FP8 | "
             "_scaled_mm calls / profiled step | max rel. loss diff (steps) | peak GiB bf16 / FP8 | verdict |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for c in doc["cases"]:
        if c.get("skipped"):
            lines.append(f"| {c['case']} | - | - | - | - | - | - | - | - | **skipped**: {c['skipped']} |")
            continue
        a = c["arms"].get("bf16", {})
        b = c["arms"].get(c["fp8_arm"], {})
        cmp_ = c.get("compare", {})

        def tps(x):
            if "error" in x:
                return "error"
            if not x:
                return "-"
            mfu = f" ({x['mfu_bf16_peak_pct']}%)" if x.get("mfu_bf16_peak_pct") is not None else ""
            return f"{x['tokens_per_s']:,.0f}{mfu}"

        diff = cmp_.get("max_rel_loss_diff")
        lines.append(
            f"| {c['case']} | {c['tokens_per_step']:,} | {tps(a)} | {tps(b) if b else c.get('fp8_skipped', '-')} | "
            f"{cmp_.get('ratio', '-')} | {b.get('linears_converted', '-')} | "
            f"{b.get('profile', {}).get('scaled_mm_calls', '-')} (bf16: {a.get('profile', {}).get('scaled_mm_calls', '-')}) | "
            f"{'-' if diff is None else f'{diff:.2e}'} ({cmp_.get('parity_steps', '-')}) | "
            f"{a.get('peak_mem_gib', '-')} / {b.get('peak_mem_gib', '-')} | **{cmp_.get('verdict', '-')}** |")
    lines.append("")
    if doc.get("fp8_unavailable"):
        lines.append(f"- FP8 arm not run: {doc['fp8_unavailable']}")
    for c in doc["cases"]:
        if c["case"] in WORKER_BF16 and not c.get("skipped"):
            t, m = WORKER_BF16[c["case"]]
            own = c["arms"].get("bf16", {}).get("tokens_per_s")
            here = f"this loop's bf16 arm ran {own:,.0f} on uniform {c['seq']:,}-token rows" if own else "this loop"
            lines.append(f"- {c['case']}: the worker's fast path trains this shape in bf16 at {t:,} tokens/s "
                         f"(MFU {m}%) on packed chat records of 50 to 2,000 tokens; {here}. Not the same workload: "
                         f"only this call's FP8/bf16 ratio carries over, not its tokens/s.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for fp8_speed.json and fp8_speed.md")
    p.add_argument("--cases", default=None, help="comma-separated case names (default: all, in order)")
    p.add_argument("--steps", type=int, default=None, help="steps per arm, warm-up included (default 50; smoke 6)")
    p.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 5; smoke 2)")
    p.add_argument("--budget-s", type=float, default=390, help="skip a case whose estimate no longer fits")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shape on the CPU, bf16 against bf16")
    args = p.parse_args(argv)
    start = time.perf_counter()
    args.hard_deadline = start + args.budget_s + 40
    import torch

    table = SMOKE_CASES if args.cpu_smoke else CASES
    args.steps = args.steps or (6 if args.cpu_smoke else 50)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.cpu_smoke else 5)
    if not 0 < args.warmup < args.steps:
        p.error("--warmup must be at least 1 and below --steps")
    names = args.cases.split(",") if args.cases else list(table)
    for n in names:
        if n not in table:
            p.error(f"--cases: unknown case {n!r} (known: {', '.join(table)})")
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device: run on a GPU, or use --cpu-smoke")
    no_fp8 = fp8_unavailable(torch, args.cpu_smoke)
    try:
        import torchao

        tao = torchao.__version__
    except ImportError:
        tao = None
    import transformers

    doc = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
           "gpu": torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({platform.processor() or 'cpu'})",
           "versions": {"python": platform.python_version(), "torch": torch.__version__,
                        "cuda": torch.version.cuda, "transformers": transformers.__version__, "torchao": tao},
           "steps": args.steps, "warmup": args.warmup, "budget_s": args.budget_s,
           "parity_limit": PARITY_LIMIT, "pays_at": PAYS_AT, "fp8_unavailable": no_fp8, "cases": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fp8_key = "bf16-again" if args.cpu_smoke else "fp8"

    def save():
        doc["elapsed_s"] = round(time.perf_counter() - start, 1)
        (out / "fp8_speed.json").write_text(json.dumps(doc, indent=1) + "\n")
        (out / "fp8_speed.md").write_text(markdown(doc))

    for n in names:
        case = table[n]
        entry = {"case": n, **{k: v for k, v in case.items() if k != "est_s"},
                 "tokens_per_step": case["rows"] * case["seq"], "fp8_arm": fp8_key, "arms": {}}
        doc["cases"].append(entry)
        left = args.budget_s - (time.perf_counter() - start)
        if left < case["est_s"]:
            entry["skipped"] = f"{left:.0f} s of the budget left, the case needs about {case['est_s']} s"
            print(f"[{n}] skipped: {entry['skipped']}", flush=True)
            save()
            continue
        arms = [("bf16", False)]
        if args.cpu_smoke:
            arms.append(("bf16-again", False))
        elif no_fp8:
            entry["fp8_skipped"] = no_fp8
        else:
            arms.append(("fp8", True))
        for arm, fp8 in arms:
            print(f"[{n}] {arm}: building, compiling, {args.steps} steps", flush=True)
            try:
                r = run_arm(torch, arm, case, args, device, fp8)
            except Exception as e:  # the one call must report every case: the error is the arm's result
                r = {"arm": arm, "error": f"{type(e).__name__}: {e}"[:600],
                     "traceback": traceback.format_exc()[-3000:]}
                print(r["traceback"], flush=True)
                gc.collect()
                if device.type == "cuda":
                    torch._dynamo.reset()
                    torch.cuda.empty_cache()
            entry["arms"][arm] = r
            if "error" not in r:
                print(f"[{n}] {arm}: {r['tokens_per_s']:,.0f} tokens/s, MFU {r['mfu_bf16_peak_pct']}%, "
                      f"converted {r['linears_converted']}, _scaled_mm calls {r['profile']['scaled_mm_calls']}, "
                      f"loss {r['losses'][0]} -> {r['losses'][-1]}, warm-up {r['warmup_s']} s, "
                      f"peak {r['peak_mem_gib']} GiB", flush=True)
            save()
        if fp8_key in entry["arms"]:
            entry["compare"] = compare(n, entry["arms"], fp8_key)
        else:
            entry["compare"] = {"verdict": "fp8 not run", "why": no_fp8}
        print(f"[{n}] {json.dumps(entry['compare'])}", flush=True)
        save()
    save()
    print(markdown(doc), flush=True)
    if args.cpu_smoke:
        bad = [c["case"] for c in doc["cases"] if c.get("compare", {}).get("max_rel_loss_diff") != 0.0]
        if bad:
            print(f"smoke: the two bf16 arms differ in {bad}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
