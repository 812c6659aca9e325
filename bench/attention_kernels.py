"""Varlen attention of packed rows on one GPU: the kernels the worker can use, side by side.

    python bench/attention_kernels.py [--shape 7b] [--rows 4] [--json OUT.json]

Rows are packed as the worker packs them (training.fast.packing, 128-token multiples) from records whose
lengths are drawn as bench/train_speed.py draws them (log-uniform in [50, 2000] tokens), about 17k tokens a
row (what the memory probe picks for 7B LoRA on an H200). Each variant runs forward and backward of one
layer's attention (q, k, v of the shape's heads, bf16) through training.fast.attention, as the compiled
decoder layer calls it:

  flash-2048   FlashAttention 2 with the constant bound model_max_length (what kernel_inputs gives it)
  flash        FlashAttention 2 with the row's own longest record as the bound
  cudnn        cuDNN's fused attention (nvidia-cudnn-frontend), record count padded to a power of two
               and the constant bound (what kernel_inputs gives it); backward plans per row width, as the
               frontend keys them
  cudnn-1plan  the same with training.fast.attention.bound_cudnn_totals(--tokens): one backward plan,
               sized for the widest row, serves every width (the rows here have different widths)

Prints per variant the mean forward+backward time over the rows, attention TFLOP/s (causal: 2*2*s^2*h*d/2
per record forward, 2.5x that backward), and the largest differences of the output and of dq, dk, dv from
flash-2048's (bf16 rounding is ~1e-2 of the values' scale), and the first call's time per row (a plan
built for the row shows there).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.fast import attention as att  # noqa: E402
from training.fast.packing import balanced_bins  # noqa: E402

SHAPES = {"7b": (28, 4, 128), "1.5b": (12, 2, 128)}  # query heads, kv heads, head dim
SEQ = 2048


def row_lengths(rng: random.Random, tokens: int) -> list[int]:
    lens = []
    while sum(lens) < tokens:
        lens.append(int(math.exp(rng.uniform(math.log(50), math.log(2000)))))
    return lens[:-1]


def make_rows(n_rows: int, tokens: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n_rows):
        lens = row_lengths(rng, tokens)
        rows.append([lens[i] for i in balanced_bins(lens, tokens)[0]])
    return rows


def flops(lens: list[int], hq: int, d: int) -> float:
    fwd = sum(2 * 2 * s * s * hq * d / 2 for s in lens)
    return fwd * 3.5  # forward + backward (2.5x)


def run(kernel: str, bound_mode: str, q, k, v, cu, longest: int, scale: float):
    att.set_kernel(kernel)
    if kernel == "cudnn" or bound_mode == "const":
        cu_k, bound = att.kernel_inputs(cu, longest, SEQ)
    else:
        cu_k, bound = cu, longest
    fn = att._cudnn_varlen if kernel == "cudnn" else att._flash_varlen
    qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = fn(qq, kk, vv, cu_k, bound, scale)
    g = torch.ones_like(out) / out.numel() ** 0.5
    out.backward(g)
    return out.detach(), qq.grad, kk.grad, vv.grad


def timed(kernel, bound_mode, q, k, v, cu, longest, scale, reps: int) -> float:
    for _ in range(2):
        run(kernel, bound_mode, q, k, v, cu, longest, scale)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        run(kernel, bound_mode, q, k, v, cu, longest, scale)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--tokens", type=int, default=17024)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    hq, hkv, d = SHAPES[a.shape]
    dev = torch.device("cuda")
    variants = [("flash-2048", "flash", "const"), ("flash", "flash", "row")]
    cudnn_error = None
    plain_round = bound_round = None
    if att.cudnn_available():
        variants += [("cudnn", "cudnn", "row"), ("cudnn-1plan", "cudnn", "row")]
        att.set_kernel("cudnn")
        from cudnn.sdpa.fwd import torch_op

        plain_round = torch_op._round64
        att.bound_cudnn_totals(a.tokens)
        bound_round, torch_op._round64 = torch_op._round64, plain_round
    else:
        cudnn_error = "nvidia-cudnn-frontend not importable or GPU older than Hopper"
    results = {name: {"ms": [], "first_ms": [], "tflops": [], "max_diff": {}} for name, _, _ in variants}
    for r, lens in enumerate(make_rows(a.rows, a.tokens)):
        total = sum(lens)
        width = -(-total // 128) * 128
        seg = lens + ([width - total] if width > total else [])
        cu = torch.tensor([0] + list(torch.tensor(seg).cumsum(0).tolist()), dtype=torch.int32, device=dev)
        longest = max(seg)
        torch.manual_seed(r)
        q = torch.randn(width, hq, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(width, hkv, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(width, hkv, d, device=dev, dtype=torch.bfloat16)
        scale = d ** -0.5
        ref = run("flash", "const", q, k, v, cu, longest, scale)
        for name, kernel, mode in variants:
            if kernel == "cudnn":  # per-width plans for "cudnn", one bounded plan for "cudnn-1plan"
                torch_op._round64 = bound_round if name == "cudnn-1plan" else plain_round
            try:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                got = run(kernel, mode, q, k, v, cu, longest, scale)
                torch.cuda.synchronize()
                first = (time.perf_counter() - t0) * 1e3
                diffs = {n: float((x.float() - y.float()).abs().max()) for n, x, y in
                         zip(("out", "dq", "dk", "dv"), got, ref)}
                ms = timed(kernel, mode, q, k, v, cu, longest, scale, a.reps) * 1e3
            except Exception as e:  # a kernel the installed stack cannot run: reported, not fatal
                results[name]["error"] = f"{type(e).__name__}: {e}"[:500]
                continue
            res = results[name]
            res["ms"].append(ms)
            res["first_ms"].append(first)
            res["tflops"].append(flops(lens, hq, d) / (ms / 1e3) / 1e12)
            for n, x in diffs.items():
                res["max_diff"][n] = max(res["max_diff"].get(n, 0.0), x)
        print(f"row {r}: {len(lens)} records, {total} tokens (width {width}), longest {longest}", flush=True)
    base = sum(results["flash-2048"]["ms"]) / max(len(results["flash-2048"]["ms"]), 1)
    print(f"\n{'variant':<12} {'fwd+bwd ms':>11} {'TFLOP/s':>8} {'vs flash-2048':>14}  max |diff| out/dq/dk/dv"
          "  first call per row ms")
    for name, res in results.items():
        if not res["ms"]:
            print(f"{name:<12} failed: {res.get('error')}")
            continue
        ms = sum(res["ms"]) / len(res["ms"])
        res["mean_ms"], res["mean_tflops"] = ms, sum(res["tflops"]) / len(res["tflops"])
        res["speedup_vs_flash_2048"] = base / ms
        md = res["max_diff"]
        print(f"{name:<12} {ms:11.3f} {res['mean_tflops']:8.1f} {base / ms:13.2f}x  "
              f"{md['out']:.2e}/{md['dq']:.2e}/{md['dk']:.2e}/{md['dv']:.2e}  "
              + " ".join(f"{x:.0f}" for x in res["first_ms"]))
    if cudnn_error:
        print("cudnn:", cudnn_error)
    out = {"shape": a.shape, "heads": [hq, hkv, d], "tokens_per_row": a.tokens, "rows": a.rows,
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "results": results,
           "cudnn_error": cudnn_error}
    try:
        import cudnn

        out["cudnn_backend"] = cudnn.backend_version_string() if hasattr(cudnn, "backend_version_string") else None
        out["cudnn_frontend"] = getattr(cudnn, "__version__", None)
    except ImportError:
        pass
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
