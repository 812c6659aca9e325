"""Measured against estimated peak GPU memory, for configurations the fixture did not cover.

    python bench/memory_check.py                      # every configuration, one fresh process each
    python bench/memory_check.py --configs qwen3-1.7b-lora-2048x2
    python bench/memory_check.py --dry-run            # estimates only: no torch, no GPU

Same recipe as tests/fixtures/peak_memory_h200.csv (tests/fixtures/README.md): random-init Qwen shapes from
their public config.json built directly on the GPU, sdpa attention, random token batches,
`loss = model(input_ids=x, labels=x).loss` under bf16 autocast, the output dropped before
`backward()`, clip_grad_norm_(1.0), fused AdamW, zero_grad(set_to_none=True), 3 optimizer steps,
no accumulation. LoRA: peft r=64, alpha 16, on all seven projections. Each configuration runs in
its own process so the allocator starts clean. Memory from torch.cuda.max_memory_allocated /
max_memory_reserved, GiB; the estimate is qwen_tui.plan.estimate's `peak_allocated` (what torch
allocates) and `total` (plus CUDA context and fragmentation), so the ratios compare like with like.

Results go to bench/results/memory_check-DATE-GPU.json with the machine and versions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen_tui.model.spec import resolve_model  # noqa: E402
from qwen_tui.plan.estimate import RunShape, estimate_memory  # noqa: E402  (pure, no torch)

# name: (hub id for the shape, method, seq, micro-batch, checkpointing, pure bf16 weights, lora dropout)
CONFIGS = {
    "qwen2.5-0.5b-full-2048x8": ("Qwen/Qwen2.5-0.5B", "full", 2048, 8, False, False, 0.05),
    "qwen2.5-1.5b-full-1024x2": ("Qwen/Qwen2.5-1.5B", "full", 1024, 2, False, False, 0.05),
    "qwen2.5-1.5b-fullbf16-4096x4-ckpt": ("Qwen/Qwen2.5-1.5B", "full", 4096, 4, True, True, 0.05),
    "qwen2.5-1.5b-lora-4096x2-ckpt": ("Qwen/Qwen2.5-1.5B", "lora", 4096, 2, True, False, 0.05),
    "qwen2.5-7b-lora-1024x2": ("Qwen/Qwen2.5-7B", "lora", 1024, 2, False, False, 0.05),
    "qwen2.5-7b-lora-4096x2-ckpt-nodrop": ("Qwen/Qwen2.5-7B", "lora", 4096, 2, True, False, 0.0),
    "qwen3-1.7b-lora-2048x2": ("Qwen/Qwen3-1.7B", "lora", 2048, 2, False, False, 0.05),
    "qwen3-8b-lora-2048x1-ckpt": ("Qwen/Qwen3-8B", "lora", 2048, 1, True, False, 0.05),
}


def estimate(name: str):
    hub, method, seq, mb, ckpt, pure, drop = CONFIGS[name]
    run = RunShape(method=method, zero_stage=None, precision="bf16", seq=seq, micro_batch=mb, grad_accum=1,
                   gradient_checkpointing=ckpt, lora_r=64, lora_dropout=drop, master_fp32=not pure)
    return estimate_memory(resolve_model(hub), run, 1)


def measure(name: str) -> dict:
    """Runs one configuration on the GPU (in this process) and returns what torch saw."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hub, method, seq, mb, ckpt, pure, drop = CONFIGS[name]
    spec = resolve_model(hub)
    cfg = dict(model_type=spec.architecture, vocab_size=spec.vocab, hidden_size=spec.hidden,
               intermediate_size=spec.intermediate, num_hidden_layers=spec.layers,
               num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
               tie_word_embeddings=spec.tied_embeddings, max_position_embeddings=max(32768, seq),
               rope_theta=1000000.0, rms_norm_eps=1e-6, use_cache=False)
    if spec.architecture == "qwen3":
        cfg["head_dim"] = spec.head_dim
    dev = torch.device("cuda")
    torch.cuda.reset_peak_memory_stats()
    dtype = torch.bfloat16 if (pure or method != "full") else torch.float32
    with dev:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=dtype,
                                                 attn_implementation="sdpa")
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        if ckpt:
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=64, lora_alpha=16, lora_dropout=drop, task_type="CAUSAL_LM",
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                 "gate_proj", "up_proj", "down_proj"]))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    after_build = torch.cuda.memory_allocated() / 2**30
    step_s = []
    for _ in range(3):
        x = torch.randint(0, spec.vocab, (mb, seq), device=dev)
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=x, labels=x)
        loss = out.loss
        del out  # as HF Trainer: the logits are not kept into backward
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1.record()
        torch.cuda.synchronize()
        step_s.append(t0.elapsed_time(t1) / 1000)
    return {
        "after_build_gib": round(after_build, 4),
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 4),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 4),
        "step_s": [round(s, 4) for s in step_s],
        "n_trainable": sum(p.numel() for p in params),
    }


def _child(name: str) -> int:
    try:
        print(json.dumps({"status": "ok", **measure(name)}))
    except Exception as e:  # an OOM is a result here, not a crash
        import torch

        if isinstance(e, torch.cuda.OutOfMemoryError):
            print(json.dumps({"status": "OOM", "error": str(e).splitlines()[0]}))
            return 0
        raise
    return 0


def _env() -> dict:
    import torch

    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda}
    for mod in ("transformers", "peft"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_total_gib=round(p.total_memory / 2**30, 3))
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--dry-run", action="store_true", help="print the estimates only (no torch, no GPU)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="directory for the JSON results")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args.child)

    rows = []
    print(f"{'config':38s} {'meas alloc':>10s} {'est alloc':>10s} {'ratio':>6s} {'meas resv':>10s} {'est total':>10s}")
    for name in args.configs:
        est = estimate(name)
        row = {"config": name, "estimate": est.to_dict()}
        if not args.dry_run:
            r = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True, text=True,
                               timeout=900)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
            row["measured"] = json.loads(lines[-1]) if lines else {"status": "error", "error": r.stderr[-2000:]}
        m = row.get("measured", {})
        if m.get("status") == "ok":
            row["ratio_allocated"] = round(est.peak_allocated / m["peak_allocated_gib"], 4)
            row["ratio_total_to_reserved"] = round(est.total / m["peak_reserved_gib"], 4)
            print(f"{name:38s} {m['peak_allocated_gib']:10.2f} {est.peak_allocated:10.2f} "
                  f"{row['ratio_allocated']:6.3f} {m['peak_reserved_gib']:10.2f} {est.total:10.2f}")
        else:
            status = m.get("status", "estimate only")
            print(f"{name:38s} {status:>10s} {est.peak_allocated:10.2f} {'':6s} {'':10s} {est.total:10.2f}")
        rows.append(row)
    if args.dry_run:
        return 0
    env = _env()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = (env.get("gpu") or "cpu").replace("NVIDIA ", "").replace(" ", "-")
    path = out / f"memory_check-{env['date'][:10]}-{gpu}.json"
    path.write_text(json.dumps({"env": env, "rows": rows}, indent=2) + "\n")
    ratios = [r["ratio_allocated"] for r in rows if "ratio_allocated" in r]
    if ratios:
        print(f"max |ratio - 1| = {max(abs(x - 1) for x in ratios):.3f} over {len(ratios)} configurations")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
