"""The fast path on a built model (training.fast.choice decides the switches; this applies them).

prepare()    before the optimizer (and the DeepSpeed engine, whose hooks must see it): our loss module, the packed
             rows' attention kernel (cuDNN after its self-test, else FlashAttention 2), ZeRO-3's leaf layers and
             gathered LM head, compiled layers
size_rows()  after the model can run a step (without DeepSpeed at once, under it once the engine has built its
             optimizer states): the packed-row budget from the memory probe, gradient checkpointing if nothing fits
             without it or rows would be short without it, then cuDNN's plans for rows of that size
FastLoss     the module DDP or DeepSpeed wraps when the loss is ours: one micro-batch (packed row or padded
             batch) -> (summed token loss, labelled tokens); the decoder runs without building the full logits,
             and the head and loss run in HeadLoss (under ZeRO-3 the module DeepSpeed gathers the head for)
pack_step()  one optimizer step's records of this rank -> packed rows (empty_row() pads a rank with fewer)
probe_tokens()
             the packed-row budget from two CUDA memory probes (training.fast.autobatch) of rows the loss module
             makes as its training rows are (FastLoss.probe_row: chat records; DPO's: pairs)
set_lora_input_cast()
             peft's cast of adapter inputs to the adapters' fp32, on or off (--lora_input_cast)

The loss normalisation is the recipe's, unchanged: every micro-batch's summed loss is divided by the
supervised tokens of the whole optimizer step over all ranks.
"""

from __future__ import annotations

import logging

import torch

from training.data.encoding import IGNORE_INDEX  # the label of a token the loss skips
from training.fast.autobatch import worth_checkpointing
from training.flags import FastFlags, PrefFlags, Resolved, TrainFlags
from training.model.pretrained import checkpointing
from training.runtime import dist
from training.runtime.errors import InputError

log = logging.getLogger("training")


def attention_shape(model_config: dict) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dimension) of the model's attention."""
    heads = int(model_config["num_attention_heads"])
    head_dim = int(model_config.get("head_dim") or int(model_config["hidden_size"]) // heads)
    return heads, int(model_config.get("num_key_value_heads") or heads), head_dim


def attention_dtype(train: TrainFlags) -> torch.dtype:
    # The attention runs in 16 bits (training.fast.attention), fp32 weights or not.
    return torch.float16 if train.fp16 else torch.bfloat16


def prepare(model, fast, model_config: dict, device, stage: int, *, train: TrainFlags, pref: PrefFlags,
            max_length: int, kernel: str, model_name: str, resolved: Resolved):
    """Applies the switches that change the model; returns our loss module (model + loss), or None where
    transformers' loss runs. fast.packing_tokens gets its default (--packing_tokens as set-up resolved it, or
    micro-batch x length); fast.gradient_checkpointing is set-up's. max_length: --model_max_length; kernel:
    --attention_kernel as given; model_name: for the error that names the model."""
    fast.gradient_checkpointing = bool(resolved.gradient_checkpointing)
    loss_module = (FastLoss(model, fast.ce, max_length, fast.labelled_logits)
                   if fast.our_loss and pref.stage != "dpo" else None)
    if pref.stage == "dpo":  # packing is required (training.args.check_pref): the loss is always ours
        from training.fast.preference import PreferenceLoss

        loss_module = PreferenceLoss(model, fast.ce, max_length, fast.labelled_logits,
                                     pref.pref_beta, pref.pref_loss, pref.pref_ftx)
    if fast.packing:
        from training.fast.attention import cudnn_self_test, cudnn_shape_unfit, set_kernel, use_packed_attention

        shape = attention_shape(model_config)
        unfit = cudnn_shape_unfit(shape[2]) if fast.attention == "cudnn" else None
        if unfit and kernel == "cudnn":
            raise InputError(f"--attention_kernel cudnn: {unfit} ({model_name}); use --attention_kernel flash")
        if fast.attention == "cudnn" and not unfit and kernel == "auto":
            unfit = cudnn_self_test(*shape, attention_dtype(train), device, max_length)
            if unfit:
                log.warning("%s; using FlashAttention 2", unfit)
        if unfit:  # the automatic choice was made before the model's shape was known, or failed its self-test
            fast.attention, fast.why["attention_kernel"] = "flash", f"flash: {unfit}"
        use_packed_attention(model)
        set_kernel(fast.attention)
        pair = 2 if pref.stage == "dpo" else 1  # a DPO row holds pairs: two answers a record
        fast.packing_tokens = resolved.packing_tokens or train.per_device_train_batch_size * pair * max_length
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


def rank_max(device, value: float) -> float:
    """The largest `value` any rank has (the value itself without torch.distributed)."""
    return float(dist.all_reduce_max(torch.tensor([float(value)], dtype=torch.float64, device=device)).item())


def any_rank(device, flag: bool) -> bool:
    """flag or-ed over every rank."""
    return bool(rank_max(device, float(flag)))


def size_rows(model, loss_module, fast, model_config: dict, device, autocast, train_module, engine=None,
              items=None, *, given: FastFlags, train: TrainFlags, max_length: int, checkpointing_asked: bool | None):
    """Sets fast.packing_tokens from the memory probe where fast.auto_micro_batch (the smallest budget any rank
    measured), turning gradient checkpointing on if not even one record fits without it or where it at least
    doubles rows that would be short without it (autobatch.worth_checkpointing); then builds cuDNN's plans.
    train_module: what runs the forward (put in training mode for the probes); items: the tokenized training
    records (None for a lazy data set); given: the fast path's flags (the probe's budget); max_length:
    --model_max_length; checkpointing_asked: --gradient_checkpointing as set-up resolved it (None: ours to
    choose)."""
    if fast.auto_micro_batch:
        train_module.train()  # dropout and checkpointing as in training
        vocab = int(model_config.get("vocab_size") or 1000)

        def probe():
            return probe_tokens(loss_module, device, max_length, vocab, autocast,
                                given.auto_memory_fraction, given.auto_max_tokens, engine=engine)

        plan = probe()
        sample = loss_module.SAMPLE if loss_module is not None else FastLoss.SAMPLE
        unit = f"{max_length}-token {sample}" if sample == "record" else f"{sample} of {max_length}-token answers"
        # --no_gradient_checkpointing (False, not None) keeps it off unless nothing fits without it. Every rank
        # decides alike (a probe is a collective step under ZeRO-3): any rank's need is every rank's.
        may_choose = checkpointing_asked is None or not plan.fits
        if not fast.gradient_checkpointing and any_rank(device, may_choose and worth_checkpointing(plan)):
            if not plan.fits:
                log.info("auto micro-batch: one %s does not fit without gradient checkpointing; turning it on", unit)
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
            raise InputError(f"not even one {unit} (--model_max_length {max_length}) fits in "
                             f"{given.auto_memory_fraction:.0%} of the GPU with gradient checkpointing; lower "
                             "--model_max_length, use LoRA/Q-LoRA, ZeRO-3 or more GPUs")
        # Every rank packs to the same budget: the smallest any rank measured.
        fast.packing_tokens = int(-rank_max(device, -plan.tokens))
        ran_out = (f" (a probe of {plan.ceiling} tokens ran out of memory: rows no longer than the largest that "
                   "ran)") if plan.ceiling else ""
        log.info("auto micro-batch: %.2f MiB a token, %.1f GiB fixed -> packed rows of %d tokens%s",
                 plan.bytes_per_token / 2**20, plan.fixed_bytes / 2**30, fast.packing_tokens, ran_out)
    if fast.packing and fast.attention == "cudnn":
        _warm_cudnn(fast, attention_dtype(train), max_length, model_config, device, items)


def _warm_cudnn(fast, dtype: torch.dtype, max_length: int, model_config: dict, device, items) -> None:
    """cuDNN's attention plans for every record count a packed row can have, before the first step."""
    from training.fast.attention import bound_cudnn_totals, record_bucket, warm_cudnn

    bound_cudnn_totals(fast.packing_tokens)  # one backward plan per record count, for every row width
    shortest = min((len(e.input_ids) for e in items), default=1) if items is not None else 16
    most = record_bucket(fast.packing_tokens // max(shortest, 1) + 2)  # + the padding tail's segments
    n, secs = warm_cudnn(*attention_shape(model_config), dtype, device, max_length, most)
    log.info("cuDNN attention: plans for rows of up to %d records (%d sizes) built in %.1f s", most, n, secs)


def set_lora_input_cast(model, enabled: bool) -> int:
    """Turns peft's cast of adapter inputs to the adapter dtype on or off in every LoRA layer; returns how many."""
    n = 0
    for m in model.modules():
        if hasattr(m, "lora_A") and hasattr(m, "_cast_input_dtype"):
            m.cast_input_dtype_enabled = enabled
            n += 1
    return n


class HeadLoss(torch.nn.Module):
    """The LM head and the loss as a module of its own, with no parameters of its own: hidden states -> (summed
    token loss, labelled tokens). Under DeepSpeed ZeRO-3 the head's weight is registered as this module's external
    parameter (shard_head_weight), so the engine gathers the partitioned weight for this module's forward and
    backward only, and reduces its gradient like any other. The head is held outside the module tree: it stays
    the model's, saved once under its own name."""

    def __init__(self, head, ce: str, labelled_only: bool):
        super().__init__()
        self.__dict__["_head"] = head  # not a child module: no second path to its weight in state_dict
        self.ce = ce
        self.labelled_only = labelled_only

    def forward(self, hidden: torch.Tensor, batch: dict):
        from training.fast.step import head_loss_sum

        return head_loss_sum(hidden, self._head.weight, batch, self.ce, labelled_only=self.labelled_only)


class FastLoss(torch.nn.Module):
    """model + our loss: forward(batch) -> (summed token loss, labelled tokens). DDP or the DeepSpeed engine wraps
    this, so the forward they see is the one that runs (ZeRO-3's hooks gather each module's weights as it runs)."""

    def __init__(self, model, ce: str, max_segment: int, labelled_only: bool = False):
        super().__init__()
        from training.fast.compile import lm_head_of

        self.model = model
        self.ce = ce
        self.max_segment = max_segment
        self.labelled_only = labelled_only
        self.head_loss = HeadLoss(lm_head_of(model), ce, labelled_only)

    def forward(self, batch: dict):
        from training.fast.step import decoder_hidden

        return self.head_loss(decoder_hidden(self.model, batch, self.max_segment), batch)

    # The sequences one sample of the data puts in a row, never split across rows: a chat record (DPO: a pair's
    # two answers). The memory probe's smallest row holds one such sample of full length.
    SEQUENCES = 1
    SAMPLE = "record"

    def probe_row(self, tokens: int, vocab: int, length: int) -> dict:
        """A packed row of `tokens` tokens of records of `length` tokens, every token labelled: the most memory a
        training row of that width can take (the memory probe's row)."""
        from training.fast.packing import pack

        return pack([ProbeRecord(i, length, vocab) for i in range(tokens // length)], tokens, 0, max_segment=length)

    def shard_head_weight(self) -> None:
        """ZeRO-3: the LM head's weight (the embedding's too, when tied) is gathered for head_loss, whose forward
        uses it outside the head module's own forward."""
        import deepspeed

        deepspeed.zero.register_external_parameter(self.head_loss, self.head_loss._head.weight)


class ProbeRecord:
    """A record of `length` tokens, every one labelled (the memory probe's): ids spread over the vocabulary."""

    def __init__(self, i: int, length: int, vocab: int):
        self.input_ids = [(i * 7919 + j) % max(vocab - 1, 1) for j in range(length)]
        self.labels = list(self.input_ids)


class _Filler:
    """A record of padding with no labels: what an empty row is made of."""

    def __init__(self, n: int, pad_id: int):
        self.input_ids = [pad_id] * n
        self.labels = [IGNORE_INDEX] * n


def empty_row(width: int, pad_id: int, max_segment: int) -> dict:
    from training.fast.packing import pack

    row = pack([_Filler(width, pad_id)], width, pad_id, None, max_segment)
    row["real_tokens"], row["records"] = 0, 0
    return row


def pack_step(items, capacity: int, pad_id: int, pad_multiple: int, max_segment: int) -> list[dict]:
    """One optimizer step's records of this rank as packed rows (first fit, in the sampler's order)."""
    from training.fast.packing import pack_batches

    return pack_batches(list(items), capacity, pad_id, pad_multiple=pad_multiple, max_segment=max_segment)


def probe_tokens(loss_module: FastLoss, device, max_segment: int, vocab: int, autocast, fraction: float,
                 max_tokens: int, engine=None):
    """Forward+backward probes of packed rows of full-length records (two, and up to two more where the plan
    reaches far past them: autobatch.plan_by_probing); returns training.fast.autobatch.Plan.
    The rows are the loss module's own (FastLoss.probe_row): chat records for SFT, pairs of two full-length
    answers for DPO (whose head keeps float32 log-probabilities a chunk at a time and recomputes them in the
    backward), so the probes measure the step that trains; their sizes are one and two of the loss module's
    full-length samples (SEQUENCES records: a record, or a pair). engine: the DeepSpeed engine that wraps
    loss_module. Its optimizer states and gradient buffers exist already, so the probes measure them; they run
    through the engine, as training does, with the loss times zero: the gradients they add to the first step's
    accumulation are zeros (ZeRO-2/3 reduce every micro-batch, so gradients cannot simply be dropped), with the
    same memory and kernels as a real micro-batch. max_segment: --model_max_length, the length of the probe's records."""
    from training.fast import autobatch
    from training.fast.step import to_device

    def run(tokens: int):
        from training.fast.sequence_parallel import local

        row = to_device(local(loss_module.probe_row(tokens, vocab, max_segment)), device)
        if engine is not None:
            engine.set_gradient_accumulation_boundary(False)
            s, _ = engine(row)
            engine.backward(s * 0.0, scale_wrt_gas=False)
            return
        with autocast():
            s, _ = loss_module(row)
        (s * 0.0).backward()
        loss_module.zero_grad(set_to_none=True)

    def agree(tokens: int) -> int:  # every rank runs the same probes (each is a collective step under ZeRO)
        return int(rank_max(device, tokens))

    from training.fast import sequence_parallel

    # Without DeepSpeed or sequence parallelism a probe waits on no other rank: each rank probes as it needs, and
    # one that runs out of memory is caught (probe_plan); with them every rank runs the same probes, and an
    # out-of-memory error ends the run as before (a rank cannot step out of a collective alone).
    alone = engine is None and sequence_parallel.active() is None
    # The probes draw dropout masks; the run's random numbers start where they would without them.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        return autobatch.probe_plan(loss_module.model, run, device, max_segment * loss_module.SEQUENCES,
                                    fraction=fraction, agree=None if alone else agree,
                                    max_tokens=max_tokens, states_built=engine is not None,
                                    optimizer=_torch_optimizer_of(engine) if engine is not None else None,
                                    optimizer_params=_fp32_partitions_of(engine) if engine is not None else None)


def _torch_optimizer_of(engine):
    """The torch optimizer inside a DeepSpeed engine's ZeRO optimizer (the one holding the Adam states)."""
    opt = engine.optimizer
    while opt is not None and not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "optimizer"):
        opt = opt.optimizer
    return opt if isinstance(opt, torch.optim.Optimizer) else None


def _fp32_partitions_of(engine):
    """The flat fp32 partitions a ZeRO-3 engine steps: it puts them in the torch optimizer's groups only inside its
    step, so they are not there to be counted at the probe. None elsewhere (ZeRO-1/2 keep them in the groups)."""
    flats = getattr(engine.optimizer, "fp32_partitioned_groups_flat", None)
    return list(flats) if flats else None
