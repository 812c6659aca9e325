"""Setting the fast path up on a built model (training.fastpath decides the switches; this applies them).

prepare()    before the optimizer (and the DeepSpeed engine, whose hooks must see it): our loss module, the packed
             rows' attention kernel (cuDNN after its self-test, else FlashAttention 2), ZeRO-3's leaf layers and
             gathered LM head, compiled layers
size_rows()  after the model can run a step (without DeepSpeed at once, under it once the engine has built its
             optimizer states): the packed-row budget from the memory probe, gradient checkpointing if nothing fits
             without it or rows would be short without it, then cuDNN's plans for rows of that size
"""

from __future__ import annotations

import logging

import torch

from training import dist, fastpath
from training.fast.autobatch import worth_checkpointing
from training.model import checkpointing
from training.errors import InputError

log = logging.getLogger("training")


def attention_shape(model_config: dict) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dimension) of the model's attention."""
    heads = int(model_config["num_attention_heads"])
    head_dim = int(model_config.get("head_dim") or int(model_config["hidden_size"]) // heads)
    return heads, int(model_config.get("num_key_value_heads") or heads), head_dim


def attention_dtype(args) -> torch.dtype:
    # The attention runs in 16 bits (training.fast.attention), fp32 weights or not.
    return torch.float16 if args.fp16 else torch.bfloat16


def prepare(model, args, fast, model_config: dict, device, stage: int):
    """Applies the switches that change the model; returns our loss module (model + loss), or None where
    transformers' loss runs. fast.packing_tokens gets its default (--packing_tokens, or micro-batch x length)."""
    fast.gradient_checkpointing = bool(args.gradient_checkpointing)
    loss_module = (fastpath.FastLoss(model, fast.ce, args.model_max_length, fast.labelled_logits)
                   if fast.our_loss else None)
    if fast.packing:
        from training.fast.attention import cudnn_self_test, cudnn_shape_unfit, set_kernel, use_packed_attention

        shape = attention_shape(model_config)
        unfit = cudnn_shape_unfit(shape[2]) if fast.attention == "cudnn" else None
        if unfit and args.attention_kernel == "cudnn":
            raise InputError(f"--attention_kernel cudnn: {unfit} ({args.model_name_or_path}); use "
                             "--attention_kernel flash")
        if fast.attention == "cudnn" and not unfit and args.attention_kernel == "auto":
            unfit = cudnn_self_test(*shape, attention_dtype(args), device, args.model_max_length)
            if unfit:
                log.warning("%s; using FlashAttention 2", unfit)
        if unfit:  # the automatic choice was made before the model's shape was known, or failed its self-test
            fast.attention, fast.why["attention_kernel"] = "flash", f"flash: {unfit}"
        use_packed_attention(model)
        set_kernel(fast.attention)
        fast.packing_tokens = args.packing_tokens or args.per_device_train_batch_size * args.model_max_length
    if stage == 3:
        from training.fast import zero3

        zero3.prepare(model, loss_module)  # before deepspeed.initialize registers its hooks
    if fast.compile:
        from training.fast.compile import compile_decoder_layers

        # Before the probes: they then measure the compiled layers' memory (less than eager's), and their
        # two rows (one and two records of --model_max_length) compile both sides of Inductor's guard on the
        # row width (training.fast.compile) at start-up instead of at some later step. Under ZeRO-3 only the
        # layers' forwards compile: DeepSpeed's hooks around them stay eager.
        compile_decoder_layers(model, forward_only=stage == 3)
    return loss_module


def any_rank(device, flag: bool) -> bool:
    """flag or-ed over every rank (the flag itself without torch.distributed)."""
    return bool(dist.all_reduce_max(torch.tensor([float(flag)], dtype=torch.float64, device=device)).item())


def size_rows(model, loss_module, fast, args, model_config: dict, device, autocast, train_module, engine=None,
              items=None) -> None:
    """Sets fast.packing_tokens from the memory probe where fast.auto_micro_batch (the smallest budget any rank
    measured), turning gradient checkpointing on if not even one record fits without it or where it at least
    doubles rows that would be short without it (autobatch.worth_checkpointing); then builds cuDNN's plans.
    train_module: what runs the forward (put in training mode for the probes); items: the tokenized training
    records (None for a lazy data set)."""
    if fast.auto_micro_batch:
        train_module.train()  # dropout and checkpointing as in training
        vocab = int(model_config.get("vocab_size") or 1000)

        def probe():
            return fastpath.probe_tokens(loss_module, device, args.model_max_length, vocab, autocast,
                                         args.auto_memory_fraction, args.auto_max_tokens, engine=engine)

        plan = probe()
        # --no_gradient_checkpointing (False, not None) keeps it off unless nothing fits without it. Every rank
        # decides alike (a probe is a collective step under ZeRO-3): any rank's need is every rank's.
        may_choose = args.gradient_checkpointing is None or not plan.fits
        if not fast.gradient_checkpointing and any_rank(device, may_choose and worth_checkpointing(plan)):
            if not plan.fits:
                log.info("auto micro-batch: one %d-token record does not fit without gradient checkpointing; "
                         "turning it on", args.model_max_length)
            checkpointing(model, True)
            with_ckpt = probe()
            if any_rank(device, worth_checkpointing(plan, with_ckpt)):
                if plan.fits:
                    log.info("auto micro-batch: rows of %d tokens without gradient checkpointing, %d with it; "
                             "turning it on", plan.tokens, with_ckpt.tokens)
                fast.gradient_checkpointing, plan = True, with_ckpt
            else:
                checkpointing(model, False)
        if not plan.fits:
            raise InputError(f"not even one record of --model_max_length {args.model_max_length} tokens fits in "
                             f"{args.auto_memory_fraction:.0%} of the GPU with gradient checkpointing; lower "
                             "--model_max_length, use LoRA/Q-LoRA, ZeRO-3 or more GPUs")
        # Every rank packs to the same budget: the smallest any rank measured.
        t = dist.all_reduce_max(torch.tensor([-plan.tokens], dtype=torch.float64, device=device))
        fast.packing_tokens = int(-t.item())
        log.info("auto micro-batch: %.2f MiB a token, %.1f GiB fixed -> packed rows of %d tokens",
                 plan.bytes_per_token / 2**20, plan.fixed_bytes / 2**30, fast.packing_tokens)
    if fast.packing and fast.attention == "cudnn":
        _warm_cudnn(fast, args, model_config, device, items)


def _warm_cudnn(fast, args, model_config: dict, device, items) -> None:
    """cuDNN's attention plans for every record count a packed row can have, before the first step."""
    from training.fast.attention import bound_cudnn_totals, record_bucket, warm_cudnn

    bound_cudnn_totals(fast.packing_tokens)  # one backward plan per record count, for every row width
    shortest = min((len(e.input_ids) for e in items), default=1) if items is not None else 16
    most = record_bucket(fast.packing_tokens // max(shortest, 1) + 2)  # + the padding tail's segments
    n, secs = warm_cudnn(*attention_shape(model_config), attention_dtype(args), device, args.model_max_length, most)
    log.info("cuDNN attention: plans for rows of up to %d records (%d sizes) built in %.1f s", most, n, secs)
