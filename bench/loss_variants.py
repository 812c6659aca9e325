"""The worker's loss-side switches, side by side in one process on one GPU, step by step.

    python bench/loss_variants.py [--shape 7b] [--method lora] [--rounds 8] [--json OUT.json]

Changes of 1-3% are within what separates one rented H200 from the next, so comparing them across calls
(bench/train_speed.py runs one configuration per process) says little. Here one model is built and
compiled once, and every round runs the same step's records once per variant, in a rotated order, with
the GPU synchronised around each step. The variants differ only in the loss:

  now          the LM head on the supervised positions only, Liger in chunks of 2,048 rows (the defaults)
  alllogits    the LM head on every position, 2,048-row chunks (--no_labelled_logits_only)
  ligerchunks  supervised positions only, Liger's own chunks (TRAINING_LIGER_CHUNK_ROWS=0)
  before       every position, Liger's own chunks: the worker before these two

Before timing, each variant's loss on the same first row (no gradient) is printed: they must agree (bf16
sums in another order). The model, data, packing (128-token multiples), probe, compiled layers, fused AdamW
and LoRA (r64, alpha 16, dropout 0.05, bf16 adapter inputs) are the worker's. Prints, per variant, real
tokens/s over the timed rounds, the median step, MFU as bench/train_speed.py counts it, and the ratio to
`before`. `--device cpu --shape tiny --ce chunked` is a smoke run of the machinery (no Liger, no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

VARIANTS = {  # name -> (LM head on supervised positions only, TRAINING_LIGER_CHUNK_ROWS or None for the default)
    "now": (True, None),
    "alllogits": (False, None),
    "ligerchunks": (True, "0"),
    "before": (False, "0"),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="7b", choices=["7b", "1.5b", "tiny"])
    p.add_argument("--method", default="lora", choices=["lora", "full"])
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ", ".join(VARIANTS))
    p.add_argument("--rounds", type=int, default=8, help="timed rounds (each runs every variant once)")
    p.add_argument("--records-per-step", type=int, default=64)
    p.add_argument("--tokens", type=int, default=0, help="packed row budget (default: the memory probe's)")
    p.add_argument("--mem-fraction", type=float, default=0.9)
    p.add_argument("--max-tokens", type=int, default=49152)
    p.add_argument("--ce", default="liger", choices=["liger", "chunked"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    names = a.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")

    import torch
    import train_speed as ts

    from training.fast import autobatch
    from training.fast.attention import use_packed_attention
    from training.fast.compile import compile_decoder_layers
    from training.fast.optim import make_adamw
    from training.fast.packing import pack, pack_batches
    from training.fast.step import micro_batch_loss_sum, to_device

    dev = torch.device(a.device, 0) if a.device == "cuda" else torch.device("cpu")
    cuda = dev.type == "cuda"
    seq = ts.SEQ if a.shape != "tiny" else 256

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    model = ts.build_model(a.shape, torch.float32 if a.method == "full" else torch.bfloat16, dev)
    if a.method == "lora":
        model = ts.add_lora(model)
        for m in model.modules():  # the worker's default on CUDA under bf16 autocast (--lora_input_cast off)
            if hasattr(m, "lora_A"):
                m.cast_input_dtype_enabled = not cuda
    use_packed_attention(model)
    model.train()
    vocab = ts.SHAPES[a.shape]["vocab_size"]
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else (lambda: torch.autocast(
        "cpu", dtype=torch.bfloat16, enabled=False))

    def set_variant(name):
        labelled, rows = VARIANTS[name]
        if rows is None:
            os.environ.pop("TRAINING_LIGER_CHUNK_ROWS", None)
        else:
            os.environ["TRAINING_LIGER_CHUNK_ROWS"] = rows
        return labelled

    if not a.no_compile:
        compile_decoder_layers(model)
    if a.tokens:
        budget = a.tokens
    else:
        set_variant("now")

        def probe(tokens):
            recs = [SimpleNamespace(input_ids=[(i * 7919 + j) % (vocab - 1) for j in range(seq)],
                                    labels=[(i * 7919 + j) % (vocab - 1) for j in range(seq)])
                    for i in range(tokens // seq)]
            with autocast():
                s, n = micro_batch_loss_sum(model, to_device(pack(recs, tokens, 0, max_segment=seq), dev), a.ce,
                                            max_segment=seq, labelled_only=True)
            (s / n).backward()
            model.zero_grad(set_to_none=True)

        plan = autobatch.probe_plan(model, probe, dev, seq, fraction=a.mem_fraction, max_tokens=a.max_tokens)
        if not plan.fits:
            raise SystemExit("not even one record fits without gradient checkpointing; this bench does not do it")
        budget = plan.tokens
    params = [q for q in model.parameters() if q.requires_grad]
    opt = make_adamw([{"params": params, "weight_decay": 0.1}], lr=1e-4 if a.method == "lora" else 1e-5,
                     betas=(0.9, 0.95), fused=cuda)
    R = a.records_per_step
    records = ts.make_records(R * (a.rounds + 1), vocab, seed=0) if a.shape != "tiny" else _tiny_records(R * (
        a.rounds + 1), vocab)

    def rows_of(recs):
        return [to_device({k: (v.pin_memory() if cuda and isinstance(v, torch.Tensor) else v) for k, v in r.items()},
                          dev) for r in pack_batches(recs, budget, 0, pad_multiple=128, max_segment=seq)]

    def step(name, recs):
        labelled = set_variant(name)
        n_label = sum(sum(1 for x in r.labels[1:] if x != -100) for r in recs)
        for b in rows_of(recs):
            with autocast():
                s, _ = micro_batch_loss_sum(model, b, a.ce, max_segment=seq, labelled_only=labelled)
            (s / n_label).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    # The same first row through every variant, no gradient: the losses must agree.
    first = rows_of(records[:R])[0]
    check = {}
    with torch.no_grad():
        for name in names:
            labelled = set_variant(name)
            with autocast():
                s, n = micro_batch_loss_sum(model, first, a.ce, max_segment=seq, labelled_only=labelled)
            check[name] = {"loss_sum": float(s), "labelled": int(n)}
    ref = check[names[0]]["loss_sum"]
    agree = max(abs(c["loss_sum"] - ref) / abs(ref) for c in check.values())
    print(f"first row, no gradient: {json.dumps(check)}; largest relative difference {agree:.2e}", flush=True)
    for name in names:  # warm-up: compiles and autotunes every variant's path
        step(name, records[:R])
    sync()
    times = {n: [] for n in names}
    real = sum(len(r.input_ids) for r in records[R:2 * R])
    tokens = {n: 0 for n in names}
    for r in range(a.rounds):
        recs = records[(r + 1) * R:(r + 2) * R]
        k = r % len(names)
        for name in names[k:] + names[:k]:  # rotated: no variant always runs right after the same one
            sync()
            t0 = time.perf_counter()
            step(name, recs)
            sync()
            times[name].append(time.perf_counter() - t0)
            tokens[name] += sum(len(x.input_ids) for x in recs)
    s_eff = ts.effective_seq(records)
    f = ts.flops_per_token(a.shape, "full" if a.method == "full" else "lora", s_eff) if a.shape != "tiny" else None
    results = {}
    for name in names:
        tps = tokens[name] / sum(times[name])
        results[name] = {"tokens_per_s": tps, "median_step_s": statistics.median(times[name]), "steps": times[name],
                         "mfu": tps * f / (ts.PEAK_TFLOPS * 1e12) if f else None}
    base = results.get("before", results[names[0]])["tokens_per_s"]
    print(f"\n{'variant':<12} {'tokens/s':>10} {'median s':>9} {'MFU':>6} {'vs before':>10}")
    for name, r in results.items():
        r["vs_before"] = r["tokens_per_s"] / base
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        print(f"{name:<12} {r['tokens_per_s']:10,.0f} {r['median_step_s']:9.3f} {mfu:>6} {r['vs_before']:9.3f}x")
    out = {"shape": a.shape, "method": a.method, "ce": a.ce, "device": str(dev), "row_budget": budget,
           "records_per_step": R, "rounds": a.rounds, "real_tokens_per_step": real, "seq_eff": s_eff,
           "first_row_check": check, "first_row_max_rel_diff": agree, "results": results,
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev) if cuda else None}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


def _tiny_records(n: int, vocab: int) -> list:
    """The smoke run's records: short, with prompts, within the tiny shape's vocabulary."""
    import random

    rng = random.Random(0)
    out = []
    for _ in range(n):
        length = rng.randint(8, 120)
        ids = [rng.randrange(0, vocab - 1) for _ in range(length)]
        out.append(SimpleNamespace(input_ids=ids, labels=[-100] * (length // 3) + ids[length // 3:]))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
