"""Training speed on one GPU: the stock Qwen recipe against our worker's fast path, same data.

    python bench/train_speed.py --out bench/results/DIR            # every configuration, one process each
    python bench/train_speed.py --configs ours-lora-7b --steps 5   # some of them
    python bench/train_speed.py --smoke --out /tmp/s               # every code path on the 1.5B shape, few steps

Models are random-init Qwen2.5 shapes built from their public configs (1.5B, 7B), bf16, on the
GPU. Data: one synthetic chat set, record lengths log-uniform in [50, 2000] tokens, the first
third of each record masked as prompt; every configuration reads the same records in the same
order. Throughput counts real tokens (no padding).

stock  HF Trainer + DeepSpeed ZeRO-2 (training/ds_config_zero2.json) + gradient checkpointing,
       per-device batch 2, accumulation 8, every record padded to model_max_length (2048) as Qwen's
       published finetune.py does; LoRA r=64 alpha=16 dropout 0.05 on all linear projections, or
       full fine-tuning.
ours   the worker itself, `python -m training.finetune` in one process, with its automatic fast path
       (training.fast through training.recipe): packed rows (no padding, varlen attention that
       keeps records apart), Liger fused linear cross-entropy (no full logits), per-decoder-layer
       torch.compile, fused AdamW, the packed-row budget from a two-probe memory measurement
       (--auto_memory_fraction 0.9, --auto_max_tokens 49152), gradient checkpointing only if nothing
       fits without it or rows would be short without it (under 8,192 tokens, where it at least doubles
       them); --random_init builds the model on the GPU from the shape's config.json. The data is the
       same synthetic set written as a JSONL file of chat records (one user and one assistant turn
       of single-token words, each record exactly as long as its synthetic twin; the tokenizer is the
       tiny built-in one, whose ids the random model takes as well as any); 64 records per optimizer
       step; real tokens and step times come from the worker's metrics.jsonl.
ours-lora-7b-dpo
       the worker's DPO (--stage dpo) on the same sequences: records 2k and 2k+1 become the chosen and the
       rejected answer of pair k (one user turn, a third of the shorter), 32 pairs a step; tokens/s counts both
       sequences of every pair (the step records' tokens). Its reference pass (a forward of every pair, once
       before step 1) is reported apart and counted into an epoch's tokens/s and MFU (dpo_result).
direct the earlier harness that calls training.fast without the worker (kept for Q-LoRA, which the
       worker's --random_init cannot build: Q-LoRA there quantizes weights loaded from disk).

MFU: model FLOPs per real token = k*N + 12*L*h*s with k = 6 (full) or 4 (LoRA, frozen base: no
weight gradients), N = the parameters that take part in matmuls (all but the input embedding;
a tied embedding counts once, as the LM head), s = the token-weighted mean record length
(sum len^2 / sum len, the context a token attends over), against 989 TFLOP/s dense bf16. DPO's reference
forward: 2N + 4Lhs a token.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PEAK_TFLOPS = 989.0
SEQ = 2048
MIN_LEN, MAX_LEN = 50, 2000
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# From the public config.json of Qwen/Qwen2.5-1.5B-Instruct and Qwen/Qwen2.5-7B-Instruct.
SHAPES = {
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # Qwen/Qwen2.5-0.5B-Instruct's: the small real-shaped model of the GPU proof's curve lines (bench/gpu_proof.py).
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
               rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # CPU smoke test of the worker path only (--cpu-smoke): the tiny built-in model's shape.
    "tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6,
                 tie_word_embeddings=True),
}

CONFIGS = {
    "stock-lora-7b": dict(shape="7b", method="lora", recipe="stock"),
    "ours-lora-7b": dict(shape="7b", method="lora", recipe="ours"),
    # DPO through the worker (--stage dpo) on the same sequences: records 2k and 2k+1 become pair k's chosen and
    # rejected answers to one prompt, half as many pairs a step as records (the same sequences a step).
    "ours-lora-7b-dpo": dict(shape="7b", method="lora", recipe="ours", stage="dpo"),
    "direct-lora-7b": dict(shape="7b", method="lora", recipe="direct"),
    "direct-qlora-7b": dict(shape="7b", method="qlora", recipe="direct"),
    "direct-full-1.5b": dict(shape="1.5b", method="full", recipe="direct"),
    "stock-full-1.5b": dict(shape="1.5b", method="full", recipe="stock"),
    "ours-full-1.5b": dict(shape="1.5b", method="full", recipe="ours"),
    # Q-LoRA through the worker: the random weights are written to disk first (bf16 safetensors), and the worker
    # quantizes them to nf4 as it loads them, as it would a downloaded model.
    "ours-qlora-7b": dict(shape="7b", method="qlora", recipe="ours"),
    # The worker under DeepSpeed (Qwen's multi-node recipes), beside plain DDP above: same data, same flags, plus
    # --deepspeed builtin:zeroN.
    "ours-lora-7b-zero2": dict(shape="7b", method="lora", recipe="ours", zero=2),
    "ours-lora-7b-zero3": dict(shape="7b", method="lora", recipe="ours", zero=3),
    "ours-full-1.5b-zero2": dict(shape="1.5b", method="full", recipe="ours", zero=2),
    "ours-full-1.5b-zero3": dict(shape="1.5b", method="full", recipe="ours", zero=3),
    "ours-qlora-7b-zero2": dict(shape="7b", method="qlora", recipe="ours", zero=2),
    "ours-qlora-7b-zero3": dict(shape="7b", method="qlora", recipe="ours", zero=3),
    "ours-full-7b-zero3": dict(shape="7b", method="full", recipe="ours", zero=3),
    # Qwen's published recipe under ZeRO-3: the reference the sharded worker is held to.
    "stock-full-1.5b-zero3": dict(shape="1.5b", method="full", recipe="stock", zero=3),
    "stock-lora-7b-zero3": dict(shape="7b", method="lora", recipe="stock", zero=3),
}
# Variants of an "ours" configuration, named CONFIG+TAG[+TAG]: (environment, extra worker flags).
TAGS = {
    "inductor-rng": ({"TRAINING_COMPILE_RANDOM": "inductor"}, []),  # Inductor's own dropout random numbers
    "nodrop": ({}, ["--lora_dropout", "0"]),  # what LoRA dropout costs (not the stock hyperparameters)
    "chunked": ({}, ["--fused_ce", "chunked"]),  # our chunked cross-entropy instead of Liger's
    "eager": ({}, ["--no_compile"]),
    "cudnn": ({}, ["--attention_kernel", "cudnn"]),  # cuDNN's fused varlen attention (the automatic choice since run19)
    "flash": ({}, ["--attention_kernel", "flash"]),  # PyTorch's FlashAttention 2 (the default before run19)
    # The worker before overlapped steps and expandable segments (each step read back before the next; default
    # allocator segments), and each of the two alone.
    "sync": ({}, ["--no_overlap_steps", "--no_expandable_segments"]),
    "nooverlap": ({}, ["--no_overlap_steps"]),
    "noexpand": ({}, ["--no_expandable_segments"]),
    "fused": ({}, ["--fused_lora_dropout"]),  # LoRA dropout inside lora_A's Triton kernel (opt-in)
    "unfused": ({}, ["--no_fused_lora_dropout"]),  # peft's dropout module (the default since run16)
    "alllogits": ({}, ["--no_labelled_logits_only"]),  # the LM head on every position (the default before run18)
    "ligerchunks": ({"TRAINING_LIGER_CHUNK_ROWS": "0"}, []),  # Liger's own loss chunks (before run18), not 2,048 rows
    # Under DeepSpeed before rows were sized by memory: 8 records a micro-batch, 8 micro-batches a step (rows of
    # 8 x 2048 tokens), as issue 16 measured it.
    "mb8": ({}, ["--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "8"]),
    "nozerocompile": ({}, ["--no_compile"]),
    "gc": ({}, ["--gradient_checkpointing"]),  # checkpointing on from the start: the probe then sizes far longer rows
}
PAIRS = [("ours-lora-7b", "stock-lora-7b"), ("ours-full-1.5b", "stock-full-1.5b"), ("direct-qlora-7b", "direct-lora-7b"),
         ("ours-qlora-7b", "ours-lora-7b"), ("ours-lora-7b", "direct-lora-7b"), ("ours-full-1.5b", "direct-full-1.5b"),
         # Sharded against plain DDP (issue 16's targets), Q-LoRA against LoRA, ours against stock under ZeRO-3.
         ("ours-lora-7b-zero2", "ours-lora-7b"), ("ours-lora-7b-zero3", "ours-lora-7b"),
         ("ours-full-1.5b-zero2", "ours-full-1.5b"), ("ours-full-1.5b-zero3", "ours-full-1.5b"),
         ("ours-qlora-7b-zero2", "ours-lora-7b-zero2"), ("ours-qlora-7b-zero3", "ours-qlora-7b-zero2"),
         ("ours-full-1.5b-zero3", "stock-full-1.5b-zero3"), ("ours-lora-7b-zero3", "stock-lora-7b-zero3")]


def config_of(name: str) -> tuple[str, dict, dict, list[str]]:
    """CONFIG[+TAG...] -> (base name, its configuration, environment, extra worker flags)."""
    base, *tags = name.split("+")
    if base not in CONFIGS:
        raise SystemExit(f"unknown configuration {base!r}; known: {', '.join(CONFIGS)}")
    env, extra = {}, []
    for t in tags:
        if re.fullmatch(r"bs[1-9][0-9]*", t) and CONFIGS[base]["recipe"] == "ours":
            # +bsN: N records a step in one micro-batch setting (issue 16's "no OOM for 1 to 128" sweep)
            extra += ["--per_device_train_batch_size", t[2:], "--gradient_accumulation_steps", "1"]
            continue
        if t not in TAGS or CONFIGS[base]["recipe"] != "ours":
            raise SystemExit(f"{name}: tag {t!r} is not one of {', '.join(TAGS)} or bsN (for ours-* configurations)")
        env.update(TAGS[t][0])
        extra += TAGS[t][1]
    return base, CONFIGS[base], env, extra
DEFAULT_CONFIGS = ["stock-lora-7b", "ours-lora-7b", "stock-full-1.5b", "ours-full-1.5b"]


# ------------------------------------------------------------------ data


def make_records(n: int, vocab: int, seed: int = 0) -> list:
    """n synthetic chat records: lengths log-uniform in [MIN_LEN, MAX_LEN], random ids, first third masked."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = int(round(math.exp(rng.uniform(math.log(MIN_LEN), math.log(MAX_LEN)))))
        ids = [rng.randrange(0, vocab - 1000) for _ in range(length)]
        prompt = max(1, length // 3)
        labels = [-100] * prompt + ids[prompt:]
        out.append(SimpleNamespace(input_ids=ids, labels=labels))
    return out


def effective_seq(records) -> float:
    lens = [len(r.input_ids) for r in records]
    return sum(x * x for x in lens) / sum(lens)


def matmul_params(shape: str) -> int:
    c = SHAPES[shape]
    h, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    per_layer = h * (h + 2 * kv) + (h + 2 * kv) + h * h + 3 * h * c["intermediate_size"] + 2 * h
    return L * per_layer + h + V * h  # layers, final norm, LM head (tied or not); not the input embedding


def flops_per_token(shape: str, method: str, seq: float) -> float:
    c = SHAPES[shape]
    k = 6 if method == "full" else 4
    return k * matmul_params(shape) + 12 * c["num_hidden_layers"] * c["hidden_size"] * seq


def forward_flops_per_token(shape: str, seq: float) -> float:
    """One forward without gradients (DPO's reference pass): 2N + 4Lhs, a third of full training's 6N + 12Lhs."""
    c = SHAPES[shape]
    return 2 * matmul_params(shape) + 4 * c["num_hidden_layers"] * c["hidden_size"] * seq


def head_flops_per_token(shape: str, method: str) -> float:
    """The LM head's share of flops_per_token: what a token whose logits are never built does not cost."""
    c = SHAPES[shape]
    return (6 if method == "full" else 4) * c["vocab_size"] * c["hidden_size"]


# ------------------------------------------------------------------ model


def build_model(shape: str, dtype, device):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**SHAPES[shape], use_cache=False)
    cfg._attn_implementation = "sdpa"
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    model.config.use_cache = False
    return model


def quantize_nf4(model, compute_dtype):
    """Replaces the decoder's projection Linears by bitsandbytes nf4 Linear4bit (double quantization),
    quantizing the random weights on the GPU: what from_pretrained(load_in_4bit) would load."""
    import bitsandbytes as bnb
    import torch

    n = 0
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if not isinstance(child, torch.nn.Linear) or name not in LORA_TARGETS:
                    continue
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=compute_dtype, compress_statistics=True, quant_type="nf4",
                                      device="meta")
                w = bnb.nn.Params4bit(child.weight.data, requires_grad=False, compress_statistics=True,
                                      quant_type="nf4")
                q.weight = w.to(child.weight.device)
                if child.bias is not None:
                    q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(parent, name, q)
                n += 1
    torch.cuda.empty_cache()
    return n


def add_lora(model):
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=64, lora_alpha=16, lora_dropout=0.05, target_modules=LORA_TARGETS, bias="none",
                     task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


# ------------------------------------------------------------------ stock recipe


def run_stock(cfg: dict, args, records, result: dict) -> None:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    t0 = time.perf_counter()
    model = build_model(cfg["shape"], torch.bfloat16, dev)
    if cfg["method"] == "lora":
        model.enable_input_require_grads()  # Qwen's finetune.py: LoRA + gradient checkpointing
        model = add_lora(model)
    result["build_s"] = time.perf_counter() - t0

    class Padded(torch.utils.data.Dataset):
        def __len__(self):
            return len(records)

        def __getitem__(self, i):
            r = records[i]
            n = len(r.input_ids)
            ids = torch.zeros(SEQ, dtype=torch.long)  # pad id 0 (labels -100, attention mask 0)
            ids[:n] = torch.tensor(r.input_ids)
            lab = torch.full((SEQ,), -100, dtype=torch.long)
            lab[:n] = torch.tensor(r.labels)
            mask = torch.zeros(SEQ, dtype=torch.long)
            mask[:n] = 1
            return {"input_ids": ids, "labels": lab, "attention_mask": mask}

    real_tokens = []

    def collate(items):
        batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
        real_tokens.append(int(batch["attention_mask"].sum()))
        return batch

    marks = []

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            torch.cuda.synchronize()
            marks.append((time.perf_counter(), len(real_tokens)))

    ds_cfg = json.loads((ROOT / "training" / f"ds_config_zero{cfg.get('zero', 2)}.json").read_text())
    total_steps = args.stock_warmup + args.stock_steps
    targs = TrainingArguments(
        output_dir=str(Path(args.tmp) / "stock"), per_device_train_batch_size=2, gradient_accumulation_steps=8,
        max_steps=total_steps, learning_rate=1e-4 if cfg["method"] == "lora" else 1e-5, weight_decay=0.1,
        adam_beta2=0.95, warmup_steps=0, lr_scheduler_type="cosine", bf16=True, gradient_checkpointing=True,
        deepspeed=ds_cfg, logging_steps=10**6, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, remove_unused_columns=False, seed=42, data_seed=42,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=Padded(), data_collator=collate,
                      callbacks=[Clock()])
    # Same records, same order as ours: no shuffling.
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(trainer.train_dataset)
    torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    trainer.train()
    result["train_wall_s"] = time.perf_counter() - t0
    (ta, na), (tb, nb) = marks[args.stock_warmup - 1], marks[-1]
    tokens = sum(real_tokens[na:nb])
    result.update(
        timed_steps=len(marks) - args.stock_warmup, timed_s=tb - ta, real_tokens=tokens,
        tokens_per_s=tokens / (tb - ta), records_per_step=16, micro_batch="2 x 2048 padded",
        padded_tokens=(nb - na) * 2 * SEQ,
        gradient_checkpointing=True,
        peak_allocated_gib=torch.cuda.max_memory_allocated(dev) / 2**30,
        peak_reserved_gib=torch.cuda.max_memory_reserved(dev) / 2**30,
    )


# ------------------------------------------------------------------ our fast path


def run_direct(cfg: dict, args, records, result: dict) -> None:
    import torch

    from training.fast import autobatch
    from training.fast.attention import use_packed_attention, varlen_available
    from training.fast.compile import compile_decoder_layers
    from training.fast.loss import liger_available
    from training.fast.optim import make_adamw
    from training.fast.packing import pack, pack_batches
    from training.fast.step import micro_batch_loss_sum, to_device

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = True
    method = cfg["method"]
    t0 = time.perf_counter()
    # Full fine-tuning keeps fp32 master weights (bf16 autocast); LoRA a frozen bf16 base with fp32 adapters.
    model = build_model(cfg["shape"], torch.float32 if method == "full" else torch.bfloat16, dev)
    if method == "qlora":
        result["nf4_layers"] = quantize_nf4(model, torch.bfloat16)
    if method in ("lora", "qlora"):
        model = add_lora(model)
        if args.keep_input_dtype:
            # peft casts each adapter's input to the fp32 adapter dtype before dropout; under bf16 autocast the
            # matmul casts it back, so keeping it bf16 computes the same thing with half the traffic.
            for m in model.modules():
                if hasattr(m, "lora_A"):
                    m.cast_input_dtype_enabled = False
        result["keep_input_dtype"] = args.keep_input_dtype
    result["build_s"] = time.perf_counter() - t0
    ce = "liger" if (liger_available() and not args.no_liger) else "chunked"
    use_packed_attention(model)
    result.update(ce=ce, varlen_flash=varlen_available(), compile=not args.no_compile)
    model.train()
    vocab = SHAPES[cfg["shape"]]["vocab_size"]

    def probe(tokens: int):
        n_rec = tokens // SEQ
        recs = [SimpleNamespace(input_ids=[(i * 7919 + j) % (vocab - 1000) for j in range(SEQ)],
                                labels=[(i * 7919 + j) % (vocab - 1000) for j in range(SEQ)]) for i in range(n_rec)]
        b = to_device(pack(recs, tokens, 0, max_segment=SEQ), dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            s, n = micro_batch_loss_sum(model, b, ce, max_segment=SEQ)
        (s / n).backward()
        model.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    gc_on = False
    if args.tokens:
        budget = args.tokens
    else:
        plan = autobatch.probe_plan(model, probe, dev, SEQ, fraction=args.mem_fraction, max_tokens=args.max_tokens)
        if not plan.fits:
            gc_on = True
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            plan = autobatch.probe_plan(model, probe, dev, SEQ, fraction=args.mem_fraction, max_tokens=args.max_tokens)
        budget = plan.tokens
        result.update(probe_bytes_per_token=plan.bytes_per_token, probe_fixed_gib=plan.fixed_bytes / 2**30)
    result.update(probe_s=time.perf_counter() - t0, tokens_per_micro_batch=budget, gradient_checkpointing=gc_on)
    if not args.no_compile:
        compile_decoder_layers(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_adamw([{"params": params, "weight_decay": 0.1}], lr=1e-4 if method != "full" else 1e-5,
                     betas=(0.9, 0.95), fused=True)
    result["fused_adamw"] = opt.is_fused

    R = args.records_per_step
    steps = args.warmup + args.steps
    tokens_done, computed, micro, losses = [], [], 0, []
    torch.cuda.reset_peak_memory_stats(dev)

    def train_step(recs):
        nonlocal micro
        rows = pack_batches(recs, budget, 0, pad_multiple=1024, max_segment=SEQ)
        n_label = sum(sum(1 for x in r.labels[1:] if x != -100) for r in recs)
        step_loss = 0.0
        for row in rows:
            b = to_device({k: (v.pin_memory() if isinstance(v, torch.Tensor) else v) for k, v in row.items()}, dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                s, _ = micro_batch_loss_sum(model, b, ce, max_segment=SEQ)
            loss = s / n_label
            loss.backward()
            step_loss = step_loss + loss.detach()
            micro += 1
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(step_loss)  # a device tensor: no sync here
        return sum(r["input_ids"].shape[1] for r in rows)

    t_start = time.perf_counter()
    for step in range(args.warmup):
        train_step(records[step * R:(step + 1) * R])
        if step == 0:
            torch.cuda.synchronize()
            result["first_step_s"] = time.perf_counter() - t_start
    torch.cuda.synchronize()
    marks = [time.perf_counter()]
    for step in range(args.warmup, steps):
        recs = records[step * R:(step + 1) * R]
        computed.append(train_step(recs))
        tokens_done.append(sum(len(r.input_ids) for r in recs))
    torch.cuda.synchronize()
    marks.append(time.perf_counter())
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            train_step(records[:R])
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=90))
    timed = marks[-1] - marks[0]
    tokens = sum(tokens_done)
    result.update(row_fill=tokens / sum(computed), first_loss=float(losses[0]),
                  
        timed_steps=args.steps, timed_s=timed, real_tokens=tokens, tokens_per_s=tokens / timed,
        records_per_step=R, micro_batch=f"packed rows of <= {budget} tokens", micro_batches=micro,
        last_loss=float(losses[args.warmup + args.steps - 1]),
        peak_allocated_gib=torch.cuda.max_memory_allocated(dev) / 2**30,
        peak_reserved_gib=torch.cuda.max_memory_reserved(dev) / 2**30,
    )


# ------------------------------------------------------------------ ours: through the worker


def write_worker_inputs(tmp: Path, shape: str, records, pairs: bool = False) -> tuple[Path, Path, list[int]]:
    """A model directory (the shape's config.json + the tiny built-in tokenizer, no weights) and a JSONL file
    of chat records whose rendered token lengths are exactly those of `records`; returns them and the lengths.
    pairs: preference pairs instead (TRL's conversational prompt / chosen / rejected), records 2k and 2k+1 the
    chosen and the rejected sequence of pair k, whose one user turn is a third of the shorter of the two."""
    from transformers import AutoTokenizer, Qwen2Config

    from training.data.encoding import ChatEncoder
    from training.data.records import Conversation
    from training.model.tiny import build_tiny

    tiny = build_tiny(tmp / "tiny-tokenizer")
    model_dir = tmp / f"qwen2.5-{shape}-random"
    model_dir.mkdir(parents=True, exist_ok=True)
    for f in tiny.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors", "generation_config.json"):
            (model_dir / f.name).write_bytes(f.read_bytes())
    cfg = Qwen2Config(**SHAPES[shape], use_cache=False)
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.dtype = "bfloat16"
    cfg.save_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = ChatEncoder(tok, 10**6)
    # Words that are one token each after a space: a record of k of them is k tokens plus the markup.
    words = []
    for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]):
        w = tok.convert_tokens_to_string([t])
        if w.startswith(" ") and w[1:].isalpha() and len(tok(w, add_special_tokens=False)["input_ids"]) == 1:
            words.append(w[1:])
    if len(words) < 20:
        raise RuntimeError(f"the tokenizer has only {len(words)} single-token words")
    rng = random.Random(1)

    def text(k):
        return " " + " ".join(rng.choice(words) for _ in range(k))

    def length(user, asst):
        conv = Conversation(index=0, id="x", messages=[{"role": "user", "content": user},
                                                        {"role": "assistant", "content": asst}])
        return len(enc.encode(conv).input_ids)

    overhead = length(text(1), text(1)) - 2
    if pairs:
        return model_dir, *_write_pairs(tmp / f"pairs-{shape}.jsonl", records, text, length, overhead)
    data, lens = tmp / f"chat-{shape}.jsonl", []
    with open(data, "w") as out:
        for n, r in enumerate(records):
            target = len(r.input_ids)
            body = max(target - overhead, 2)
            k_user = max(1, min(body - 1, target // 3 - overhead // 2))
            user, asst = text(k_user), text(body - k_user)
            got = length(user, asst)
            if got != target:  # a word pair merged across the markup: trim or pad the reply
                asst = text(max(1, body - k_user - (got - target)))
                got = length(user, asst)
            lens.append(got)
            out.write(json.dumps({"id": f"r{n}", "messages": [{"role": "user", "content": user},
                                                                {"role": "assistant", "content": asst}]}) + "\n")
    return model_dir, data, lens


def _write_pairs(data: Path, records, text, length, overhead: int) -> tuple[Path, list[int]]:
    lens = []
    with open(data, "w") as out:
        for k in range(len(records) // 2):
            a, b = len(records[2 * k].input_ids), len(records[2 * k + 1].input_ids)
            body_a, body_b = max(a - overhead, 2), max(b - overhead, 2)
            k_user = max(1, min(min(body_a, body_b) - 1, min(a, b) // 3 - overhead // 2))
            user = text(k_user)
            sides = []
            for target, body in ((a, body_a), (b, body_b)):
                asst = text(body - k_user)
                got = length(user, asst)
                if got != target:  # a word pair merged across the markup: trim or pad the answer
                    asst = text(max(1, body - k_user - (got - target)))
                    got = length(user, asst)
                lens.append(got)
                sides.append([{"role": "assistant", "content": asst}])
            out.write(json.dumps({"id": f"p{k}", "prompt": [{"role": "user", "content": user}], "chosen": sides[0],
                                  "rejected": sides[1]}) + "\n")
    return data, lens


def save_random_weights(model_dir: Path, shape: str) -> None:
    """The shape's random-init model (seed 0, bf16) written into model_dir as safetensors (run in a process of its
    own, so its GPU memory is gone before the worker starts)."""
    import torch

    model = build_model(shape, torch.bfloat16, "cuda" if torch.cuda.is_available() else "cpu")
    model.config.architectures = ["Qwen2ForCausalLM"]
    model.save_pretrained(model_dir, safe_serialization=True)


def run_ours_worker(name: str, cfg: dict, args, log_path: Path, extra_env: dict | None = None,
                    extra_args: list[str] | None = None) -> dict:
    """`python -m training.finetune` with its automatic fast path on the synthetic chat records; the result from
    its metrics.jsonl (steps after the warm-up; with --worker-profile one more step runs under the profiler and
    is not timed). A DPO configuration (stage "dpo") counts the tokens of both sequences of every pair, as the
    worker's step records do, and adds what its reference pass cost (dpo_result)."""
    shape = args.shape or cfg["shape"]
    dpo = cfg.get("stage") == "dpo"
    result = {"config": name, **cfg, "shape": shape, "status": "running", "recipe": "ours (worker)"}
    tmp = Path(args.tmp) / name
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    R, steps = args.records_per_step, args.warmup + args.steps
    vocab = SHAPES[shape]["vocab_size"]
    records = make_records(steps * R, vocab, seed=0)
    t0 = time.perf_counter()
    model_dir, data, lens = write_worker_inputs(tmp, shape, records, pairs=dpo)
    result["data_s"] = time.perf_counter() - t0
    result["length_mismatches"] = sum(a != len(r.input_ids) for a, r in zip(lens, records))
    method = cfg["method"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    init = ["--random_init"]
    if method == "qlora":
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--save-random", str(model_dir), "--shape", shape], check=True,
                       env=env, timeout=args.timeout)
        result["weights_s"] = time.perf_counter() - t0
        init = []
    run_steps = steps + (1 if args.worker_profile else 0)
    cmd = [sys.executable, "-m", "training.finetune", "--model_name_or_path", str(model_dir), *init,
           "--data_path", str(data), "--output_dir", str(tmp / "out"), "--max_steps", str(run_steps),
           "--per_device_train_batch_size", str(R // 2 if dpo else R), "--gradient_accumulation_steps", "1",
           "--model_max_length", str(SEQ),
           "--learning_rate", "1e-5" if dpo else "1e-4" if method != "full" else "1e-5",
           "--weight_decay", "0.1", "--adam_beta2", "0.95", "--lr_scheduler_type", "cosine",
           "--save_strategy", "no", "--logging_steps", "1", "--seed", "42"]
    if shape != "tiny":
        cmd += ["--bf16", "--auto_memory_fraction", str(args.mem_fraction), "--auto_max_tokens", str(args.max_tokens)]
        # bf16's figures (MFU on bf16's peak, the README's and the GPU proof's): --fp8 auto would run a 7B LoRA
        # base in FP8 where torchao is installed (bench/fp8_worker.py measures that against bf16)
        cmd += ["--fp8", "off"]
    if args.tokens:
        cmd += ["--packing_tokens", str(args.tokens)]
    if method in ("lora", "qlora"):
        cmd += ["--use_lora", "--lora_r", "64", "--lora_alpha", "16", "--lora_dropout", "0.05"]
        cmd += ["--q_lora"] if method == "qlora" else []
    cmd += ["--no_compile"] * args.no_compile + (["--fused_ce", "chunked"] if args.no_liger else [])
    cmd += ["--profile_step", str(run_steps)] if args.worker_profile else []
    cmd += ["--profile_trace"] if args.worker_profile and args.worker_trace else []
    if cfg.get("zero"):
        cmd += ["--deepspeed", f"builtin:zero{cfg['zero']}"]
    cmd += ["--stage", "dpo"] if dpo else []
    cmd += list(extra_args or [])  # later flags win: a variant's flags override the defaults above
    t0 = time.perf_counter()
    with open(log_path, "a") as log:
        log.write(f"===== {name}: {' '.join(f'{k}={v}' for k, v in (extra_env or {}).items())} {' '.join(cmd)}\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    result["worker_wall_s"] = time.perf_counter() - t0
    metrics = tmp / "out" / "metrics.jsonl"
    recs = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    step_recs = [r for r in recs if "event" not in r]
    start = next((r for r in recs if r.get("event") == "start"), {})
    end = next((r for r in recs if r.get("event") == "end"), {})
    if rc != 0 or len(step_recs) < run_steps:
        tail = log_path.read_text().splitlines()[-4:]
        result.update(status=f"failed rc={rc}", error=end.get("error") or " | ".join(tail))
        return result
    timed = step_recs[args.warmup:steps]
    if args.worker_profile and (tmp / "out" / f"profile-step{run_steps}.txt").is_file():
        prof = (tmp / "out" / f"profile-step{run_steps}.txt").read_text()
        with open(log_path, "a") as log:
            log.write(f"----- {name}: profile of step {run_steps}\n{prof}\n")
        trace = tmp / "out" / f"profile-step{run_steps}.json.gz"
        if args.worker_trace and trace.is_file():  # where the GPU waited in that step (bench/gpu_gaps.py)
            gaps_json = log_path.parent / f"gpu_gaps-{name.replace('+', '_')}.json"
            q = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_gaps.py"), str(trace), "--kernels", "--json",
                                str(gaps_json)], capture_output=True, text=True, timeout=args.timeout)
            with open(log_path, "a") as log:
                log.write(f"----- {name}: GPU idle and kernel mix in step {run_steps} (bench/gpu_gaps.py)\n"
                          f"{q.stdout}{q.stderr}\n")
            if gaps_json.is_file():
                g = json.loads(gaps_json.read_text())
                result.update(profiled_device_busy=g["device_busy_share"], profiled_idle_ms=g["idle_us"] / 1e3)
    tokens = sum(r["tokens"] for r in timed)
    secs = sum(r["step_time"] for r in timed)
    fp = start.get("fast_path", {})
    s_eff = sum(x * x for x in lens) / sum(lens)
    f = flops_per_token(shape, method, s_eff) if shape != "tiny" else None
    result.update(
        status="ok", fast_path=fp, timed_steps=len(timed), timed_s=secs, real_tokens=tokens,
        tokens_per_s=tokens / secs, records_per_step=R, pairs_per_step=R // 2 if dpo else None,
        first_step_s=step_recs[0]["step_time"],
        micro_batch=f"packed rows of <= {fp.get('packing_tokens')} tokens" if fp.get("packing") else f"{R} padded",
        micro_batches=sum(r.get("micro_batches", 0) for r in timed), gradient_checkpointing=bool(fp.get("gradient_checkpointing")),
        peak_allocated_gib=max((r.get("peak_memory_gib") or 0.0) for r in step_recs), peak_reserved_gib=None,
        first_loss=step_recs[0]["loss"], last_loss=step_recs[-1]["loss"], seq_eff=s_eff, flops_per_token=f,
        mfu=tokens / secs * f / (PEAK_TFLOPS * 1e12) if f else None, flops_rule="6N+12Lhs" if method == "full" else "4N+12Lhs",
        train_runtime=end.get("train_runtime"),
        alloc_retries=max((r.get("alloc_retries") or 0) for r in step_recs),
        worker_tokens=start.get("tokens"), tokens_counted="chosen + rejected" if dpo else "every record's",
    )
    if dpo:
        result.update(dpo_result(step_recs, start, shape, s_eff, tokens / secs, f))
    if f and fp.get("labelled_logits") and not dpo:
        # MFU above counts the LM head on every token, as the rule does; the run built logits only for supervised
        # positions, so it executed fewer FLOPs. The utilisation of what it executed, for honesty's sake:
        share = sum(r["label_tokens"] for r in timed) / tokens
        executed = f - head_flops_per_token(shape, method) * (1 - share)
        result.update(label_share=share, executed_flops_per_token=executed,
                      executed_flops_util=tokens / secs * executed / (PEAK_TFLOPS * 1e12))
    return result


def dpo_result(step_recs: list[dict], start: dict, shape: str, seq: float, tokens_per_s: float,
               f: float | None) -> dict:
    """A DPO run's figures beyond a step's tokens/s: its losses and rewards, and the reference pass, which runs
    once before step 1 (one forward a pair, the base with the adapters off) and costs every trained token a
    forward beside its step: the reference's own rate (its rows after the first, which compiles the no-grad
    graph, as an SFT run's warm-up steps are left out), and tokens/s and MFU of an epoch with it counted in
    (its time added at that rate, its FLOPs, 2N + 4Lhs a token, added to the step's)."""
    losses = [r["loss"] for r in step_recs]
    out = {"losses_finite": all(math.isfinite(x) for x in losses), "losses": losses,
           "rewards_accuracy": [r.get("rewards_accuracy") for r in step_recs],
           "rewards_margin": [r.get("rewards_margin") for r in step_recs], "dpo_reference": start.get("dpo_reference")}
    ref = start.get("dpo_reference") or {}
    if (ref.get("rows") or 0) > 1 and ref.get("first_row_seconds") is not None:
        ref_tps = (ref["tokens"] - ref["first_row_tokens"]) / (ref["seconds"] - ref["first_row_seconds"])
        epoch = 1.0 / (1.0 / tokens_per_s + 1.0 / ref_tps)
        out.update(reference_tokens_per_s=ref_tps, epoch_tokens_per_s=epoch,
                   reference_compile_s=ref["first_row_seconds"])
        if f:
            fr = forward_flops_per_token(shape, seq)
            out.update(reference_flops_per_token=fr, reference_mfu=ref_tps * fr / (PEAK_TFLOPS * 1e12),
                       epoch_flops_per_token=f + fr, epoch_mfu=epoch * (f + fr) / (PEAK_TFLOPS * 1e12),
                       epoch_flops_rule="4N+12Lhs + 2N+4Lhs")
    return out


# ------------------------------------------------------------------ driver


def worker_main(args) -> int:
    import torch

    cfg = dict(CONFIGS[args.worker])
    if args.shape:
        cfg["shape"] = args.shape
    n_steps = max((args.stock_warmup + args.stock_steps) * 16, (args.warmup + args.steps) * args.records_per_step)
    records = make_records(n_steps, SHAPES[cfg["shape"]]["vocab_size"], seed=0)
    result = {"config": args.worker, **cfg, "status": "running"}
    try:
        (run_stock if cfg["recipe"] == "stock" else run_direct)(cfg, args, records, result)
        s = effective_seq(records)  # the whole data set: the same for every configuration
        f = flops_per_token(cfg["shape"], cfg["method"], s)
        result.update(status="ok", seq_eff=s, flops_per_token=f, mfu=result["tokens_per_s"] * f / (PEAK_TFLOPS * 1e12),
                      flops_rule="6N+12Lhs" if cfg["method"] == "full" else "4N+12Lhs")
    except torch.cuda.OutOfMemoryError as e:
        result.update(status="OOM", error=str(e).splitlines()[0])
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0 if result["status"] == "ok" else 3


def versions() -> dict:
    out = {"python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    for m in ("torch", "transformers", "peft", "accelerate", "deepspeed", "liger_kernel", "bitsandbytes", "triton"):
        try:
            mod = __import__(m)
            out[m] = getattr(mod, "__version__", "?")
        except ImportError as e:
            out[m] = f"missing ({e})"
    try:
        import torch

        out["cuda"] = torch.version.cuda
        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
        out["gpu_mem_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 2) if torch.cuda.is_available() else 0
        out["cudnn_backend"] = torch.backends.cudnn.version()
    except (ImportError, RuntimeError) as e:
        out["gpu"] = f"unknown ({e})"
    try:
        from importlib.metadata import version

        out["nvidia_cudnn_frontend"] = version("nvidia-cudnn-frontend")
    except ImportError:  # PackageNotFoundError is one
        out["nvidia_cudnn_frontend"] = "missing"
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True)
        out["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
    except FileNotFoundError:
        out["nvidia_smi"] = "not installed"
    return out


def table(results: list[dict]) -> str:
    by = {r["config"]: r for r in results}
    lines = ["| configuration | real tokens/s | MFU (rule) | micro-batch | grad ckpt | peak alloc GiB | peak reserved GiB | ratio |",
             "| --- | ---: | --- | --- | --- | ---: | ---: | --- |"]
    pairs = PAIRS + [(n, n.split("+")[0]) for n in by if "+" in n]
    ratio = {a: (b, by[a]["tokens_per_s"] / by[b]["tokens_per_s"]) for a, b in pairs
             if a in by and b in by and by[a].get("status") == "ok" and by[b].get("status") == "ok"}
    for r in results:
        if r.get("status") != "ok":
            lines.append(f"| {r['config']} | {r.get('status')}: {r.get('error', '')[:80]} | | | | | | |")
            continue
        rt = f"{ratio[r['config']][1]:.2f}x {ratio[r['config']][0]}" if r["config"] in ratio else ""
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
        resv = f"{r['peak_reserved_gib']:.1f}" if r.get("peak_reserved_gib") is not None else "-"
        lines.append(f"| {r['config']} | {r['tokens_per_s']:,.0f} | {mfu} ({r['flops_rule']}) | "
                     f"{r['micro_batch']} | {'on' if r['gradient_checkpointing'] else 'off'} | "
                     f"{r['peak_allocated_gib']:.1f} | {resv} | {rt} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help=f"comma-separated (default {','.join(DEFAULT_CONFIGS)}): " + ", ".join(CONFIGS))
    p.add_argument("--out", default=None, help="folder for results.json, results.md and per-configuration logs")
    p.add_argument("--steps", type=int, default=12, help="timed optimizer steps, ours (default 12)")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps, ours (compilation; default 3)")
    p.add_argument("--stock-steps", type=int, default=4, help="timed optimizer steps, stock (default 4)")
    p.add_argument("--stock-warmup", type=int, default=1, help="untimed first steps, stock (default 1)")
    p.add_argument("--records-per-step", type=int, default=64, help="records per optimizer step, ours (default 64)")
    p.add_argument("--tokens", type=int, default=0, help="fixed packed micro-batch budget (default: probe)")
    p.add_argument("--max-tokens", type=int, default=49152, help="largest packed micro-batch the probe may pick")
    p.add_argument("--mem-fraction", type=float, default=0.90, help="device memory share the probe plans for (default 0.90)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--keep-input-dtype", action="store_true", help="LoRA: no fp32 cast of adapter inputs (bf16 dropout)")
    p.add_argument("--profile", action="store_true", help="after timing, profile one step: top CUDA kernels into the log")
    p.add_argument("--no-liger", action="store_true")
    p.add_argument("--smoke", action="store_true", help="every configuration on the 1.5B shape, 2+1 steps")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="no GPU: the ours (worker) configurations on the tiny shape, 2+2 steps of 16 records")
    p.add_argument("--shape", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-profile", action="store_true",
                   help="ours: one more step after the timed ones under the worker's --profile_step; its top kernels "
                   "go into runs.log")
    p.add_argument("--worker-trace", action="store_true",
                   help="with --worker-profile: also the profiled step's Chrome trace, and bench/gpu_gaps.py's account "
                   "of where the GPU waited in it, into runs.log (and gpu_gaps-CONFIG.json beside it)")
    p.add_argument("--save-random", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tmp", default="/tmp/train_speed")
    p.add_argument("--timeout", type=float, default=400, help="seconds one configuration may run (default 400)")
    args = p.parse_args(argv)
    if args.save_random:
        save_random_weights(Path(args.save_random), args.shape)
        return 0
    if args.worker:
        return worker_main(args)

    if args.smoke:
        args.shape, args.steps, args.warmup, args.stock_steps, args.stock_warmup = "1.5b", 2, 2, 1, 1
    if args.cpu_smoke:
        args.shape, args.steps, args.warmup, args.records_per_step = "tiny", 2, 2, 16
        args.configs = ",".join(c for c in args.configs.split(",") if config_of(c)[1]["recipe"] == "ours")
    out = Path(args.out or (ROOT / "bench" / "results" / "train_speed_tmp"))
    out.mkdir(parents=True, exist_ok=True)
    env = versions()
    print(json.dumps(env), flush=True)
    results = []
    passthrough = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--stock-steps", str(args.stock_steps),
                   "--stock-warmup", str(args.stock_warmup), "--records-per-step", str(args.records_per_step),
                   "--tokens", str(args.tokens), "--max-tokens", str(args.max_tokens),
                   "--mem-fraction", str(args.mem_fraction), "--tmp", args.tmp]
    passthrough += ["--no-compile"] * args.no_compile + ["--no-liger"] * args.no_liger + ["--profile"] * args.profile + ["--keep-input-dtype"] * args.keep_input_dtype
    if args.shape:
        passthrough += ["--shape", args.shape]
    for name in args.configs.split(","):
        Path(args.tmp).mkdir(parents=True, exist_ok=True)
        js = Path(args.tmp) / f"{name}.json"
        js.unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "--worker", name, "--json", str(js)] + passthrough
        t0 = time.perf_counter()
        base, cfg, extra_env, extra_args = config_of(name)
        if cfg["recipe"] == "ours":
            r = run_ours_worker(name, cfg, args, out / "runs.log", extra_env, extra_args)
            r["process_wall_s"] = time.perf_counter() - t0
            results.append(r)
            mfu = f" MFU {100 * r['mfu']:.1f}%" if r.get("mfu") is not None else ""
            if r.get("executed_flops_util") is not None:
                mfu += (f" (executed FLOPs {100 * r['executed_flops_util']:.1f}%: LM head on the "
                        f"{100 * r['label_share']:.0f}% supervised positions only)")
            print(f"{name}: {r.get('status')} {r.get('tokens_per_s', 0):,.0f} tok/s{mfu}, allocator retries "
                  f"{r.get('alloc_retries')}, in {r['process_wall_s']:.0f}s", flush=True)
            (out / "results.json").write_text(json.dumps({"env": env, "results": results}, indent=1))
            continue
        with open(out / "runs.log", "a") as log:
            log.write(f"===== {name}: {' '.join(cmd)}\n")
            log.flush()
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        wall = time.perf_counter() - t0
        if js.is_file():
            r = json.loads(js.read_text())
        else:
            tail = (out / "runs.log").read_text().splitlines()[-4:]
            r = {"config": name, "status": f"failed rc={rc}", "error": " | ".join(tail)}
        r["process_wall_s"] = wall
        results.append(r)
        print(f"{name}: {r.get('status')} {r.get('tokens_per_s', 0):,.0f} tok/s in {wall:.0f}s", flush=True)
        (out / "results.json").write_text(json.dumps({"env": env, "results": results}, indent=1))
    (out / "results.json").write_text(json.dumps({"env": env, "results": results}, indent=1))
    md = table(results)
    (out / "results.md").write_text(f"# train_speed\n\n```\n{json.dumps(env, indent=1)}\n```\n\n{md}\n")
    print(md)
    return 0 if all(r.get("status") == "ok" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
