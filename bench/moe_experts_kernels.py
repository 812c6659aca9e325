"""One sparse MoE block of the Qwen3-30B-A3B shape, forward and backward, under each experts implementation.

    python bench/moe_experts_kernels.py --out bench/results/moe_experts.json      # CUDA, about 2 minutes
    python bench/moe_experts_kernels.py --cpu-smoke                               # the tiny shape on the CPU

The block (router + 128 experts of width 768, 8 a token, hidden 2048) in bf16 with frozen weights, as LoRA on the
attention trains it: the gradient flows to its input only (through the experts and the routing weights). For each
implementation, plain and compiled as the worker compiles its layers (dynamic shapes), on rows of T tokens:
milliseconds a forward + backward, TFLOP/s of the experts' matmuls (4 x T x k x 3 x hidden x width: forward and
input gradient), and the memory the forward keeps for the backward. eager is timed plain only (its loop over
experts reads each expert's token count back to the host; compiling it unrolls 128 experts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def block_of(shape: dict, dev, dtype):
    import torch
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(**shape)
    torch.manual_seed(0)
    with torch.device(dev):
        block = Qwen3MoeSparseMoeBlock(cfg).to(dtype)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
        p.requires_grad_(False)
    return block, cfg


def measure(block, cfg, impl: str, compiled: bool, tokens: int, iters: int, dev) -> dict:
    import torch

    cfg._experts_implementation = impl
    fn = torch.compile(block, dynamic=True) if compiled else block
    g = torch.Generator(device=dev).manual_seed(1)
    x = (torch.randn(1, tokens, cfg.hidden_size, device=dev, generator=g) * 0.5).to(block.gate.weight.dtype)
    x.requires_grad_(True)
    cuda = dev.type == "cuda"

    def step():
        y = fn(x)
        y.float().square().mean().backward()
        return y

    t0 = time.perf_counter()
    y = step()  # compile + first run
    if cuda:
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    for _ in range(2):
        step()
    x.grad = None
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with torch.no_grad():
        ref = y.detach()
    yy = fn(x)
    kept = (torch.cuda.memory_allocated() - base - yy.numel() * yy.element_size()) / 2**20 if cuda else None
    yy.float().square().mean().backward()
    x.grad = None
    del yy
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    if cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / iters * 1e3
    x.grad = None
    y = step()
    flops = 4 * tokens * cfg.num_experts_per_tok * 3 * cfg.hidden_size * cfg.moe_intermediate_size
    return {"impl": impl, "compiled": compiled, "tokens": tokens, "ms": ms, "tflops": flops / ms / 1e9,
            "first_s": first_s, "kept_mib": kept, "out": ref.float().cpu(), "grad": x.grad.float().cpu()}


def main(argv=None) -> int:
    import torch

    from bench.moe_speed import SHAPES
    from training.model import moe_experts

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="JSON results here")
    p.add_argument("--tokens", default="9088,16384", help="row widths, comma-separated")
    p.add_argument("--impls", default="eager,grouped_mm,lean")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--cpu-smoke", action="store_true")
    args = p.parse_args(argv)
    moe_experts.register()
    cuda = torch.cuda.is_available() and not args.cpu_smoke
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    shape = {k: v for k, v in SHAPES["tiny" if not cuda else "30b-a3b"].items()}
    block, cfg = block_of(shape, dev, torch.bfloat16 if cuda else torch.float32)
    tokens = [int(t) for t in args.tokens.split(",")] if cuda else [64]
    rows = []
    for t in tokens:
        ref = None
        for impl in args.impls.split(","):
            for compiled in (False, True) if (cuda and impl != "eager") else (False,):
                r = measure(block, cfg, impl, compiled, t, args.iters if cuda else 2, dev)
                out, grad = r.pop("out"), r.pop("grad")
                if ref is None:
                    ref = (out, grad)
                r["max_rel_diff_out"] = float((out - ref[0]).abs().max() / ref[0].abs().max())
                r["max_rel_diff_grad"] = float((grad - ref[1]).abs().max() / ref[1].abs().max())
                rows.append(r)
                print(f"T={t:6d} {impl:10s} {'compiled' if compiled else 'plain':8s} {r['ms']:8.2f} ms "
                      f"{r['tflops']:6.1f} TFLOP/s  kept {r['kept_mib']} MiB  first {r['first_s']:.1f} s  "
                      f"diff out {r['max_rel_diff_out']:.2e} grad {r['max_rel_diff_grad']:.2e}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(0) if cuda else "cpu",
                                              "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
