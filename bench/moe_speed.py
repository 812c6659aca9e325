"""Mixture-of-experts training speed on one GPU: the stock recipe against the worker, same data, LoRA.

    python bench/moe_speed.py --out bench/results/moe           # the Qwen3-30B-A3B shape, both recipes (~7 min)
    python bench/moe_speed.py --cpu-smoke --out /tmp/moe-smoke  # no GPU: the tiny MoE shape, every code path

Model: a random-init Qwen3-30B-A3B shape (its public config.json: 48 layers, hidden 2048, 128 experts of width
768, 8 a token; 30.5B parameters, 3.04B multiplied per token), bf16, built on the GPU. LoRA r64 alpha 16
dropout 0.05 on q/k/v/o_proj (the experts and routers frozen). Data: synthetic chat records, lengths
log-uniform in [50, 1000] tokens, the first third of each masked as prompt; both recipes read the same records in
the same order; throughput counts real tokens (no padding).

stock  Hugging Face Trainer with transformers' own Qwen3-MoE forward (its experts implementation, sdpa
       attention, output_router_logits: the load-balancing loss in the loss), peft LoRA, fused AdamW, no DeepSpeed
       (the bf16 base fits one H200), every record padded to 1,024 tokens, micro-batch 2 (8 ran out of memory
       on an H200), accumulation 8.
ours   `python -m training.finetune --random_init` with its automatic fast path (packed rows, fused loss, compiled
       layers, the experts' kernel it picks, the memory probe's row budget), the same LoRA, 64 records a step;
       the router's load-balancing loss is in its loss too (logged as aux_loss). Packages carried beside the
       image's (liger-kernel) reach it through PYTHONPATH, after this checkout.

MFU counts active parameters: FLOPs per real token = 4 x N_active + 12 x L x q_dim x s (LoRA: no weight gradients
for the frozen base), N_active = the parameters a token multiplies (attention, its 8 experts, routers, LM head;
qwen_tui.model.spec's active_matmul_params), s = the token-weighted mean record length, against 989 TFLOP/s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PEAK_TFLOPS = 989.0
MIN_LEN, MAX_LEN = 50, 1000
STOCK_SEQ = 1024
LORA = ["q_proj", "k_proj", "v_proj", "o_proj"]
# From the public config.json of Qwen/Qwen3-30B-A3B; "tiny" is training/model/tiny.py's builtin:tiny-moe shape.
SHAPES = {
    "30b-a3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                    num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                    num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, router_aux_loss_coef=0.001,
                    max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[]),
    # A small Qwen3-MoE of the real vocabulary and routing (0.9B, 32 experts, 4 a token): the GPU proof's MoE line.
    "proof": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, moe_intermediate_size=512,
                  num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_experts=32,
                  num_experts_per_tok=4, norm_topk_prob=True, router_aux_loss_coef=0.001,
                  max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  decoder_sparse_step=1, mlp_only_layers=[]),
    "tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                 num_experts_per_tok=2, norm_topk_prob=True, router_aux_loss_coef=0.001,
                 max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                 decoder_sparse_step=1, mlp_only_layers=[]),
}


def python_path() -> str:
    """This checkout first, then the caller's PYTHONPATH (where packages carried beside the image's may lie)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def make_records(n: int, vocab: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of n records: log-uniform lengths, random ids, the first third masked."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = int(round(math.exp(rng.uniform(math.log(MIN_LEN), math.log(MAX_LEN)))))
        ids = [rng.randrange(0, vocab - 8) for _ in range(length)]
        prompt = max(1, length // 3)
        out.append((ids, [-100] * prompt + ids[prompt:]))
    return out


def flops_per_token(shape: str, seq: float) -> tuple[float, int]:
    """(LoRA training FLOPs per real token on active parameters, N_active)."""
    from qwen_tui.model.spec import spec_from_config

    spec = spec_from_config({"model_type": "qwen3_moe", **SHAPES[shape]}, shape)
    n = spec.active_matmul_params
    return 4 * n + 12 * spec.layers * spec.q_dim * seq, n


def model_dir_for(tmp: Path, shape: str) -> Path:
    """The shape's config.json with the tiny built-in tokenizer (no weights: the worker's --random_init)."""
    from transformers import Qwen3MoeConfig

    from training.model.tiny import build_tiny

    tiny = build_tiny(tmp / "tiny-tokenizer")
    d = tmp / f"qwen3-moe-{shape}-random"
    d.mkdir(parents=True, exist_ok=True)
    for f in tiny.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors", "generation_config.json"):
            (d / f.name).write_bytes(f.read_bytes())
    cfg = Qwen3MoeConfig(**SHAPES[shape], use_cache=False)
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    cfg.dtype = "bfloat16"
    cfg.save_pretrained(d)
    return d


def write_token_data(path: Path, records, tok) -> None:
    """The records as chat JSONL the worker reads: one user and one assistant turn of single-token words, as many
    tokens as the original (chat markup included; a word pair merging across the markup may shift one by a token)."""
    from training.data.encoding import ChatEncoder
    from training.data.records import Conversation

    enc = ChatEncoder(tok, 10**6)
    words = [w[1:] for t, i in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
             if (w := tok.convert_tokens_to_string([t])).startswith(" ") and w[1:].isalpha()
             and len(tok(w, add_special_tokens=False)["input_ids"]) == 1]
    rng = random.Random(1)

    def text(k):
        return " " + " ".join(rng.choice(words) for _ in range(k))

    def length(user, asst):
        conv = Conversation(index=0, id="x", messages=[{"role": "user", "content": user},
                                                        {"role": "assistant", "content": asst}])
        return len(enc.encode(conv).input_ids)

    overhead = length(text(1), text(1)) - 2
    with open(path, "w") as out:
        for n, (ids, _) in enumerate(records):
            body = max(len(ids) - overhead, 2)
            k_user = max(1, min(body - 1, len(ids) // 3 - overhead // 2))
            out.write(json.dumps({"id": f"r{n}", "messages": [{"role": "user", "content": text(k_user)},
                                                                {"role": "assistant", "content": text(body - k_user)}]})
                      + "\n")


# ------------------------------------------------------------------ stock: HF Trainer, transformers' MoE forward


def run_stock(args, result: dict) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM, Trainer, TrainerCallback, TrainingArguments

    cuda = torch.cuda.is_available() and not args.cpu_smoke
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    records = make_records(args.records, SHAPES[args.shape]["vocab_size"])
    cfg = Qwen3MoeConfig(**SHAPES[args.shape], use_cache=False, output_router_logits=True)
    cfg._attn_implementation = "sdpa"
    t0 = time.perf_counter()
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if cuda else torch.float32)  # built in bf16: 61 GB, never 122 in fp32
    try:
        with torch.device(dev):
            model = Qwen3MoeForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    model = get_peft_model(model, LoraConfig(r=64, lora_alpha=16, lora_dropout=0.05, target_modules=LORA,
                                             task_type="CAUSAL_LM"))
    result["build_s"] = time.perf_counter() - t0

    class Padded(torch.utils.data.Dataset):
        def __len__(self):
            return len(records)

        def __getitem__(self, i):
            ids, lab = records[i]
            n = len(ids)
            x = torch.zeros(STOCK_SEQ, dtype=torch.long)
            y = torch.full((STOCK_SEQ,), -100, dtype=torch.long)
            m = torch.zeros(STOCK_SEQ, dtype=torch.long)
            x[:n], y[:n], m[:n] = torch.tensor(ids), torch.tensor(lab), 1
            return {"input_ids": x, "labels": y, "attention_mask": m}

    real, marks = [], []

    def collate(items):
        batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
        real.append(int(batch["attention_mask"].sum()))
        return batch

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            marks.append((time.perf_counter(), len(real)))

    targs = TrainingArguments(
        output_dir=str(Path(args.tmp) / "stock"), per_device_train_batch_size=2, gradient_accumulation_steps=8,
        max_steps=args.stock_warmup + args.stock_steps, learning_rate=1e-4, lr_scheduler_type="cosine",
        bf16=cuda, use_cpu=not cuda, optim="adamw_torch_fused" if cuda else "adamw_torch", logging_steps=10**6,
        save_strategy="no", report_to="none", disable_tqdm=True, remove_unused_columns=False, seed=42,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=Padded(), data_collator=collate, callbacks=[Clock()])
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(trainer.train_dataset)
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    trainer.train()
    (ta, na), (tb, nb) = marks[args.stock_warmup - 1], marks[-1]
    result.update(tokens_per_s=sum(real[na:nb]) / (tb - ta), timed_steps=len(marks) - args.stock_warmup,
                  micro_batch=f"2 x {STOCK_SEQ} padded", experts_implementation=cfg._experts_implementation,
                  peak_allocated_gib=torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else None)


# ------------------------------------------------------------------ ours: the worker


def run_ours(args, out: Path) -> dict:
    from transformers import AutoTokenizer

    tmp = Path(args.tmp) / "ours"
    tmp.mkdir(parents=True, exist_ok=True)
    records = make_records(args.records, SHAPES[args.shape]["vocab_size"])
    model_dir = model_dir_for(tmp, args.shape)
    data = tmp / "chat.jsonl"
    write_token_data(data, records, AutoTokenizer.from_pretrained(model_dir))
    steps = args.warmup + args.steps
    cmd = [sys.executable, "-m", "training.finetune", "--model_name_or_path", str(model_dir), "--random_init",
           "--data_path", str(data), "--output_dir", str(tmp / "out"), "--max_steps", str(steps),
           "--per_device_train_batch_size", str(args.records_per_step), "--model_max_length", str(MAX_LEN + 64),
           "--learning_rate", "1e-4", "--lr_scheduler_type", "cosine", "--save_strategy", "no", "--logging_steps",
           "1", "--seed", "42", "--use_lora", "--lora_r", "64", "--lora_alpha", "16", "--lora_dropout", "0.05",
           "--lora_target_modules", ",".join(LORA)]
    if not args.cpu_smoke:
        cmd += ["--bf16", "--auto_memory_fraction", str(args.mem_fraction)]
    cmd += args.worker_flags.split()  # later flags win
    env = {**os.environ, "PYTHONPATH": python_path(), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    with open(out / "runs.log", "a") as log:
        log.write(f"===== ours: {' '.join(cmd)}\n")
        log.flush()
        rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            timeout=args.timeout).returncode
    recs = [json.loads(x) for x in (tmp / "out" / "metrics.jsonl").read_text().splitlines()] \
        if (tmp / "out" / "metrics.jsonl").is_file() else []
    steps_done = [r for r in recs if "event" not in r]
    if rc != 0 or len(steps_done) < steps:
        return {"recipe": "ours", "status": f"failed rc={rc}", "wall_s": time.perf_counter() - t0}
    timed = steps_done[args.warmup:]
    start = recs[0]
    fp = start.get("fast_path", {})
    return {"recipe": "ours", "status": "ok", "wall_s": time.perf_counter() - t0,
            "tokens_per_s": sum(r["tokens"] for r in timed) / sum(r["step_time"] for r in timed),
            "timed_steps": len(timed), "micro_batch": f"packed rows of <= {fp.get('packing_tokens')} tokens",
            "fast_path": fp, "moe": start.get("moe"), "aux_loss": [r.get("aux_loss") for r in timed],
            "loss": [r["loss"] for r in timed],
            "peak_allocated_gib": max((r.get("peak_memory_gib") or 0.0) for r in steps_done) or None}


# ------------------------------------------------------------------ driver


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "moe_tmp"))
    p.add_argument("--recipes", default="stock,ours", help="comma-separated: stock, ours (default both)")
    p.add_argument("--steps", type=int, default=8, help="timed optimizer steps, ours (default 8)")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps, ours (compilation; default 3)")
    p.add_argument("--stock-steps", type=int, default=4, help="timed optimizer steps, stock (default 4)")
    p.add_argument("--stock-warmup", type=int, default=1, help="untimed first steps, stock (default 1)")
    p.add_argument("--records-per-step", type=int, default=64, help="records per optimizer step, ours (default 64)")
    p.add_argument("--mem-fraction", type=float, default=0.90, help="GPU memory share the probe plans for")
    p.add_argument("--worker-flags", default="", help="more worker flags for ours, e.g. '--no_compile'")
    p.add_argument("--cpu-smoke", action="store_true", help="no GPU: the tiny MoE shape, 2+1 steps of each recipe")
    p.add_argument("--timeout", type=float, default=360, help="seconds a recipe may run (default 360)")
    p.add_argument("--tmp", default="/tmp/moe_speed")
    p.add_argument("--stock-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shape", default="30b-a3b", help=argparse.SUPPRESS)
    p.add_argument("--records", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.shape, args.steps, args.warmup, args.stock_steps, args.stock_warmup = "tiny", 1, 2, 1, 1
        args.records_per_step = 8
    # every recipe reads the first records of one list: enough for the longer of the two
    args.records = args.records or max((args.stock_warmup + args.stock_steps) * 16,
                                       (args.warmup + args.steps) * args.records_per_step)
    if args.stock_child:  # the stock recipe in a process of its own: its GPU memory is gone before ours starts
        result: dict = {"recipe": "stock", "status": "ok"}
        import torch

        try:
            run_stock(args, result)
        except torch.cuda.OutOfMemoryError as e:
            result.update(status="OOM", error=str(e).splitlines()[0])
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for recipe in args.recipes.split(","):
        if recipe == "stock":
            cmd = [sys.executable, __file__, "--stock-child", "--shape", args.shape, "--records", str(args.records),
                   "--stock-steps", str(args.stock_steps), "--stock-warmup", str(args.stock_warmup),
                   "--tmp", args.tmp] + (["--cpu-smoke"] if args.cpu_smoke else [])
            t0 = time.perf_counter()
            q = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout,
                               env={**os.environ, "PYTHONPATH": python_path()})
            (out / "runs.log").open("a").write(f"===== stock: {' '.join(cmd)}\n{q.stdout}{q.stderr}\n")
            line = next((x for x in q.stdout.splitlines() if x.startswith("RESULT ")), None)
            r = json.loads(line[7:]) if line else {"recipe": "stock", "status": f"failed rc={q.returncode}"}
            r["wall_s"] = time.perf_counter() - t0
        elif recipe == "ours":
            r = run_ours(args, out)
        else:
            raise SystemExit(f"unknown recipe {recipe!r}; known: stock, ours")
        recs = make_records(args.records, SHAPES[args.shape]["vocab_size"])
        s = sum(len(i) ** 2 for i, _ in recs) / sum(len(i) for i, _ in recs)
        f, n_active = flops_per_token(args.shape, s)
        if r.get("status") == "ok":
            r.update(flops_per_token=f, active_params=n_active, seq_eff=s,
                     mfu_active=r["tokens_per_s"] * f / (PEAK_TFLOPS * 1e12))
        results.append(r)
        mfu = f", MFU on active parameters {100 * r['mfu_active']:.1f}%" if r.get("mfu_active") is not None else ""
        print(f"{recipe}: {r.get('status')} {r.get('tokens_per_s', 0):,.0f} real tokens/s{mfu} "
              f"({r.get('micro_batch', '')}; peak {r.get('peak_allocated_gib')} GiB) in {r['wall_s']:.0f}s", flush=True)
    by = {r["recipe"]: r for r in results if r.get("status") == "ok"}
    if "stock" in by and "ours" in by:
        print(f"ours / stock: {by['ours']['tokens_per_s'] / by['stock']['tokens_per_s']:.2f}x", flush=True)
    (out / "results.json").write_text(json.dumps({"shape": args.shape, "results": results}, indent=1))
    return 0 if all(r.get("status") == "ok" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
