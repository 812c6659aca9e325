"""The fused LoRA dropout (training.fast.lora_dropout) on a GPU: exact against a reference that uses the same
mask, its speed against peft's dropout + matmul, and the worker's loss curve with it and without it.

    python bench/lora_dropout_kernel.py [--rows 17024] [--json OUT] [--curve-steps 50]

1. For the 7B adapter shapes (an input of 3,584 or 18,944 features, rank 64, bf16, p = 0.05): the kernels'
   h, dx and dA against (x * keep / (1 - p)) @ A.T and its autograd in float32, with `keep` the kernels'
   own mask; the share of kept elements; and the forward and backward times of both ways (CUDA events,
   median of 20 after the autotuner has run).
2. The tiny model trained 50 steps with LoRA (dropout 0.05) through the worker, with --fused_lora_dropout
   and with --no_fused_lora_dropout, same seed and data: the two loss curves side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _median_ms(fn, reps: int = 20) -> float:
    import torch

    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def kernel_case(m: int, k: int, r: int, p: float) -> dict:
    import torch
    import torch.nn.functional as F

    from training.fast import lora_dropout as L

    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    a32 = (torch.randn(r, k, device=dev) / k ** 0.5)
    a = a32.to(torch.bfloat16)
    gh = torch.randn(m, r, device=dev, dtype=torch.bfloat16)
    seed = torch.tensor([20261129], device=dev, dtype=torch.int64)
    thr, scale = L.threshold(p)
    keep = L.mask((m, k), seed, p)
    out = {"rows": m, "features": k, "rank": r, "p": p, "keep_share": keep.float().mean().item(),
           "keep_expected": 1 - thr / L.LANE_RANGE}

    # Exactness: the same mask in float32.
    xr = x.float().requires_grad_()
    ar = a.float().requires_grad_()
    href = (xr * keep * scale) @ ar.t()
    href.backward(gh.float())
    h = L.lora_dropout_a(x, a, seed, p)
    dx, da = L.lora_dropout_a_backward(gh, x, a, seed, p, True)
    _, da_only = L.lora_dropout_a_backward(gh, x, a, seed, p, False)

    def rel(u, v):
        return ((u.float() - v.float()).norm() / v.float().norm().clamp(min=1e-30)).item()

    out.update(h_rel_err=rel(h, href), dx_rel_err=rel(dx, xr.grad), dA_rel_err=rel(da, ar.grad),
               dA_without_dx_rel_diff=rel(da_only, da),
               same_seed_same_mask=bool(torch.equal(keep, L.mask((m, k), seed, p))),
               other_seed_agreement=(keep == L.mask((m, k), seed + 1, p)).float().mean().item())

    # Speed: peft's way (dropout kernel, then the matmul; autograd for the backward) against the kernels.
    xg = x.clone().requires_grad_()
    ag = a32.clone().requires_grad_()

    def ref_fwd():
        return F.linear(F.dropout(xg, p, True), ag.to(torch.bfloat16))

    def ref_fwd_bwd():
        ref_fwd().backward(gh)

    def fused_fwd():
        return L.lora_dropout_a(x, a, seed, p)

    def fused_bwd():
        return L.lora_dropout_a_backward(gh, x, a, seed, p, True)

    for fn in (ref_fwd, ref_fwd_bwd, fused_fwd, fused_bwd):
        fn()
    torch.cuda.synchronize()
    t_ref_f = _median_ms(ref_fwd)
    t_ref_fb = _median_ms(ref_fwd_bwd)
    t_fused_f = _median_ms(fused_fwd)
    t_fused_b = _median_ms(fused_bwd)
    out.update(ref_fwd_ms=t_ref_f, ref_bwd_ms=t_ref_fb - t_ref_f, fused_fwd_ms=t_fused_f, fused_bwd_ms=t_fused_b,
               speedup_fwd=t_ref_f / t_fused_f, speedup_fwd_bwd=t_ref_fb / (t_fused_f + t_fused_b))
    out["configs"] = L.chosen_configs()
    return out


def curve(steps: int, fused: bool, tmp: Path) -> list[float]:
    outd = tmp / ("fused" if fused else "plain")
    cmd = [sys.executable, "-m", "training.finetune", "--model_name_or_path", "builtin:tiny", "--data_path",
           "builtin:demo-chat", "--output_dir", str(outd), "--use_lora", "--max_steps", str(steps),
           "--learning_rate", "2e-3", "--bf16", "--save_strategy", "no", "--seed", "7", "--no_compile",
           "--fused_lora_dropout" if fused else "--no_fused_lora_dropout"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT)] + [x for x in [os.environ.get("PYTHONPATH")] if x])}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=600)
    recs = [json.loads(x) for x in (outd / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in recs if r.get("event") == "start")
    assert start["fast_path"]["fused_lora_dropout"] is fused, start["fast_path"]
    return [r["loss"] for r in recs if "event" not in r]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=17024, help="tokens of the input (the 7B run's packed row)")
    p.add_argument("--curve-steps", type=int, default=50)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    import torch

    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    import triton

    res["triton"] = triton.__version__
    res["kernels"] = [kernel_case(a.rows, k, 64, 0.05) for k in (3584, 18944)]
    for c in res["kernels"]:
        print(json.dumps(c), flush=True)
    with tempfile.TemporaryDirectory() as t:
        fused, plain = curve(a.curve_steps, True, Path(t)), curve(a.curve_steps, False, Path(t))
    diffs = [abs(x - y) for x, y in zip(fused, plain)]
    res["curve"] = {"steps": len(fused), "fused": fused, "plain": plain, "max_abs_diff": max(diffs),
                    "first": [fused[0], plain[0]], "last10_mean": [sum(fused[-10:]) / 10, sum(plain[-10:]) / 10]}
    print(json.dumps({k: v for k, v in res["curve"].items() if k not in ("fused", "plain")}), flush=True)
    for i in range(0, len(fused), 5):
        print(f"  step {i + 1:3d}  fused {fused[i]:.4f}  plain {plain[i]:.4f}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
