"""The fine-tuning recipe: set-up, the training loop, checkpoints and the final save.

Features: full / LoRA / Q-LoRA; plain DDP (or one process) and DeepSpeed
ZeRO-2/3; CPU with gloo and CUDA with nccl; assistant-only loss normalised by
the number of supervised tokens in the whole optimizer step (so gradient
accumulation and the number of processes do not change the loss); per-batch
padding; metrics.jsonl on rank 0; atomic checkpoints with rotation; exact
resume (step, optimizer, scheduler, data order, dropout RNG); final model or
adapter, a consolidated ZeRO-3 model, and an optional merged LoRA model.

Order of set-up (see setup()): everything that can be wrong with the user's
input is checked before the process group, the model or any file is touched,
so bad input exits with code 2 in seconds and leaves the output directory alone.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from training import checkpoint as ckpt
from training import dist, dsconfig, fastpath, profiling
from training.data import ChatEncoder, Collator, StepSampler, build_dataset, eval_batches, IGNORE_INDEX
from training.errors import InputError
from training.fast import allocator
from training.metrics import MetricsWriter
from training.model import (apply_method, check_method, load_model, load_tokenizer, merge_adapter,
                            quantization_method, read_config_dict, resolve_model_source, save_pretrained_here)
from training.records import load_conversations

log = logging.getLogger("training")


class FinetuneRecipe:
    def __init__(self, args):
        self.args = args
        self.env = dist.read_env()
        self.metrics: MetricsWriter | None = None
        self.started = False
        self.step = 0
        self.engine = None  # the DeepSpeed engine, when --deepspeed is given
        self.loss_module = None  # model + our loss (training.fast), when the fast path computes the loss
        self.ddp = None
        self.scaler = None
        self._hf_ds_config = None  # keeps transformers' ZeRO-3 hook alive while loading
        self.lazy_truncated = 0  # with --lazy_preprocess: truncations met in training batches
        self._retries_warned = 0  # allocator retries already warned about
        self.meta_group = None  # the packing thread's gloo group (several ranks, packing)

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        a, env = self.args, self.env
        # 1. Cheap checks of the input, in the order a user would fix them.
        self.ds_raw = dsconfig.load(a.deepspeed) if a.deepspeed else None
        self.stage = dsconfig.zero_stage(self.ds_raw)
        self.device = dist.pick_device(env, a.use_cpu)
        if a.deepspeed and self.device.type == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # also when --use_cpu on a GPU machine
        train_convs = load_conversations(a.data_path)
        eval_convs = load_conversations(a.eval_data_path) if a.eval_data_path else None
        self.resume_dir = ckpt.resolve_resume(a.resume_from_checkpoint, a.output_dir)
        self.resume_state = ckpt.read_state(self.resume_dir) if self.resume_dir else None
        self.source = resolve_model_source(a.model_name_or_path, env.local_rank)
        self.model_config = read_config_dict(self.source)
        self.quant = quantization_method(self.model_config)
        self.method = check_method(a, self.model_config, self.device.type == "cuda", self.stage)
        self.fast = fastpath.decide(a, self.device, bool(a.deepspeed), self.stage)

        # 2. Tokenize (or, with --lazy_preprocess, only check) the data and plan the steps.
        self.tokenizer = load_tokenizer(self.source)
        encoder = ChatEncoder(self.tokenizer, a.model_max_length)
        self.train_ds = build_dataset(train_convs, encoder, a.lazy_preprocess)
        self.eval_ds = build_dataset(eval_convs, encoder, a.lazy_preprocess) if eval_convs else None
        self._log_data_stats()
        self.global_batch = env.world_size * a.per_device_train_batch_size * a.gradient_accumulation_steps
        self.steps_per_epoch = len(self.train_ds) // self.global_batch
        if self.steps_per_epoch == 0:
            raise InputError(f"{a.data_path}: {len(self.train_ds)} usable records, fewer than one global batch of "
                             f"{self.global_batch} (= {env.world_size} processes x {a.per_device_train_batch_size} "
                             f"x {a.gradient_accumulation_steps} accumulation)")
        self.total_steps = a.max_steps if a.max_steps > 0 else math.ceil(a.num_train_epochs * self.steps_per_epoch)
        if self.resume_state:
            self._check_resume_compatible()
            self.step = int(self.resume_state["step"])

        hidden = int(self.model_config.get("hidden_size") or 4096)
        self.ds_config = (dsconfig.fill(a.deepspeed, self.ds_raw, a, env.world_size, hidden, self.device.type == "cpu",
                                        dsconfig.layer_numel(self.model_config), self.fast.compile)
                          if self.ds_raw else None)

        # 3. Processes, model, optimizer.
        dist.init(env, self.device, a.ddp_timeout, need_group=bool(a.deepspeed))
        # Packed steps agree on their rows and token counts on the packing thread, through a gloo group of their own.
        self.meta_group = dist.cpu_group(a.ddp_timeout) if self.fast.packing else None
        if a.deepspeed:
            import deepspeed

            # Before the model loads: ZeRO-3 partitions weights while loading and must know the world.
            deepspeed.init_distributed(dist_backend="nccl" if self.device.type == "cuda" else "gloo")
        torch.manual_seed(a.seed)
        self._build_model()
        self._build_optimizer()
        if a.deepspeed:
            self._size_rows()  # the probes measure the engine's optimizer states and gradient buffers too
        self._build_loader()
        if self.resume_dir:
            self._load_training_state()

        # 4. Only now does anything get written.
        os.makedirs(a.output_dir, exist_ok=True)
        self.metrics = MetricsWriter(a.metrics_file, enabled=env.is_main)
        self.metrics.write({
            "event": "start", "world_size": env.world_size, "method": self.method, "zero_stage": self.stage,
            "total_steps": self.total_steps, "start_step": self.step, "steps_per_epoch": self.steps_per_epoch,
            "global_batch_size": self.global_batch, "micro_batch_size": a.per_device_train_batch_size,
            "gradient_accumulation_steps": a.gradient_accumulation_steps, "model": a.model_name_or_path,
            "data": a.data_path, "records": self.train_ds.stats.records, "usable_records": len(self.train_ds),
            "truncated_records": self.train_ds.stats.truncated, "dropped_records": self.train_ds.stats.dropped,
            "model_max_length": a.model_max_length, "device": self.device.type,
            "precision": "bf16" if a.bf16 else "fp16" if a.fp16 else "fp32",
            "resumed_from": str(self.resume_dir) if self.resume_dir else None,
            "trainable_parameters": sum(getattr(p, "ds_numel", p.numel()) for p in self.trainable_params()),
            "lazy_preprocess": a.lazy_preprocess, "fast_path": self.fast.record(),
            "base_partition": getattr(self, "base_partition", None),
        })
        self.started = True
        if env.is_main:
            log.info("%s", self.fast.summary())
        log.info("training %s for %d steps (%d per epoch, global batch %d) on %d process(es), %s%s",
                 self.method, self.total_steps, self.steps_per_epoch, self.global_batch, env.world_size,
                 self.device.type, f", ZeRO-{self.stage}" if a.deepspeed else "")

    def _log_data_stats(self) -> None:
        s, a = self.train_ds.stats, self.args
        if not self.env.is_main:
            return  # every rank tokenizes the same data: one report is enough
        if a.lazy_preprocess:
            log.info("%s: %d records checked; tokenizing lazily (truncations are counted as they happen)",
                     a.data_path, s.records)
            return
        log.info("%s: %d records, %d tokens, %d of them supervised", a.data_path, s.records, s.tokens, s.label_tokens)
        if s.truncated:
            shown = ", ".join(s.truncated_ids[:5]) + (" ..." if s.truncated > 5 else "")
            log.warning("%s: %d record(s) longer than --model_max_length %d were truncated (ids: %s)",
                        a.data_path, s.truncated, a.model_max_length, shown)
        if s.dropped:
            log.warning("%s: %d record(s) had no assistant token left after truncation and are skipped",
                        a.data_path, s.dropped)

    def _check_resume_compatible(self) -> None:
        st = self.resume_state
        if int(st.get("global_batch_size", self.global_batch)) != self.global_batch:
            raise InputError(f"{self.resume_dir}: trained with a global batch of {st['global_batch_size']}, "
                             f"now {self.global_batch}: the data order and step count would not continue")
        if st.get("method") and st["method"] != self.method:
            raise InputError(f"{self.resume_dir}: a {st['method']} checkpoint cannot resume a {self.method} run")
        if int(st.get("zero_stage", self.stage)) != self.stage:
            raise InputError(f"{self.resume_dir}: saved with ZeRO stage {st['zero_stage']}, now {self.stage}")
        if int(st["step"]) >= self.total_steps:
            raise InputError(f"{self.resume_dir}: already at step {st['step']} of {self.total_steps}")

    def _load_dtype(self):
        a = self.args
        half = torch.bfloat16 if a.bf16 else torch.float16 if a.fp16 else None
        if half is None:
            return torch.float32
        if a.deepspeed or self.method != "full":
            return half  # DeepSpeed keeps its own fp32 master copy; a LoRA base is frozen
        return torch.float32  # plain full fine-tuning: fp32 weights, autocast for the compute

    def _build_model(self) -> None:
        a = self.args
        if self.stage == 3 and self.method != "qlora":
            from transformers.integrations import HfDeepSpeedConfig

            # Tells from_pretrained to partition the weights across ranks as it loads them. transformers never does
            # that for a quantized model (and refuses a device_map then): a 4-bit base is quantized in host memory
            # and partitioned by deepspeed.initialize (training.model.load_model).
            self._hf_ds_config = HfDeepSpeedConfig(self.ds_config)
        source = self.source
        if self.resume_dir and self.method == "full" and not a.deepspeed:
            source = str(self.resume_dir)  # the checkpoint holds the full model in HF format
        model = load_model(a, source, self.method, self.device, self._load_dtype(), self.quant, self.stage)
        model = apply_method(a, model, self.method)
        if self.method != "full" and not self.fast.lora_input_cast:
            fastpath.set_lora_input_cast(model, False)
        if self.fast.fused_lora_dropout:
            from training.fast.lora_dropout import fuse_lora_dropout

            log.info("LoRA dropout fused into lora_A in %d adapted projections", fuse_lora_dropout(model))
        if self.resume_dir and self.method != "full" and not a.deepspeed:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(model, load_file(str(self.resume_dir / "adapter_model.safetensors")))
        if self.stage == 3 and self.method != "full":
            # The frozen embedding's output needs no gradient, so the first layer's inputs need none: DeepSpeed's
            # backward hook on that layer then fires as its backward starts and releases the weights it is about to
            # use (a size-0 weight in the backward, seen on an H200). With input gradients it fires after.
            model.enable_input_require_grads()
        if self.method != "qlora" and self.stage != 3:
            model.to(self.device)
        self.model = model
        self._apply_fast_path()

    def _apply_fast_path(self) -> None:
        """Packed attention, the packed-row budget (and checkpointing) from the memory probe, compiled layers."""
        a, f = self.args, self.fast
        f.gradient_checkpointing = bool(a.gradient_checkpointing)
        self.loss_module = (fastpath.FastLoss(self.model, f.ce, a.model_max_length, f.labelled_logits)
                            if f.our_loss else None)
        if f.packing:
            from training.fast.attention import cudnn_shape_unfit, set_kernel, use_packed_attention

            unfit = cudnn_shape_unfit(self._attention_shape()[2]) if f.attention == "cudnn" else None
            if unfit and a.attention_kernel == "cudnn":
                raise InputError(f"--attention_kernel cudnn: {unfit} ({a.model_name_or_path}); use "
                                 "--attention_kernel flash")
            if f.attention == "cudnn" and not unfit and a.attention_kernel == "auto":
                unfit = self._cudnn_self_test()
                if unfit:
                    log.warning("%s; using FlashAttention 2", unfit)
            if unfit:  # the automatic choice was made before the model's shape was known, or failed its self-test
                f.attention, f.why["attention_kernel"] = "flash", f"flash: {unfit}"
            use_packed_attention(self.model)
            set_kernel(f.attention)
            f.packing_tokens = a.packing_tokens or a.per_device_train_batch_size * a.model_max_length
        if self.stage == 3:
            from training.fast import zero3

            zero3.prepare(self.model, self.loss_module)  # before deepspeed.initialize registers its hooks
        if f.compile:
            from training.fast.compile import compile_decoder_layers

            # Before the probes: they then measure the compiled layers' memory (less than eager's), and their
            # two rows (one and two records of --model_max_length) compile both sides of Inductor's guard on the
            # row width (training.fast.compile) at start-up instead of at some later step. Under ZeRO-3 only the
            # layers' forwards compile: DeepSpeed's hooks around them stay eager.
            compile_decoder_layers(self.model, forward_only=self.stage == 3)
        if not a.deepspeed:
            self._size_rows()  # under DeepSpeed: once the engine has built its optimizer states (setup)

    def _size_rows(self) -> None:
        """The packed-row budget from the memory probe (turning checkpointing on if nothing fits without it), then
        cuDNN's plans for rows of that size."""
        a, f = self.args, self.fast
        if f.auto_micro_batch:
            self.wrapped.train()  # dropout and checkpointing as in training
            vocab = int(self.model_config.get("vocab_size") or 1000)

            def probe():
                return fastpath.probe_tokens(self.loss_module, self.device, a.model_max_length, vocab, self._autocast,
                                             a.auto_memory_fraction, a.auto_max_tokens, engine=self.engine)

            plan = probe()
            if not plan.fits and not f.gradient_checkpointing:
                log.info("auto micro-batch: one %d-token record does not fit without gradient checkpointing; "
                         "turning it on", a.model_max_length)
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                f.gradient_checkpointing = True
                plan = probe()
            if not plan.fits:
                raise InputError(f"not even one record of --model_max_length {a.model_max_length} tokens fits in "
                                 f"{a.auto_memory_fraction:.0%} of the GPU with gradient checkpointing; lower "
                                 "--model_max_length, use LoRA/Q-LoRA, ZeRO-3 or more GPUs")
            # Every rank packs to the same budget: the smallest any rank measured.
            t = dist.all_reduce_max(torch.tensor([-plan.tokens], dtype=torch.float64, device=self.device))
            f.packing_tokens = int(-t.item())
            log.info("auto micro-batch: %.2f MiB a token, %.1f GiB fixed -> packed rows of %d tokens",
                     plan.bytes_per_token / 2**20, plan.fixed_bytes / 2**30, f.packing_tokens)
        if f.packing and f.attention == "cudnn":
            self._warm_cudnn()

    def _cudnn_self_test(self) -> str | None:
        from training.fast.attention import cudnn_self_test

        a = self.args
        return cudnn_self_test(*self._attention_shape(), self._attention_dtype(), self.device, a.model_max_length)

    def _attention_shape(self) -> tuple[int, int, int]:
        """(query heads, key/value heads, head dimension) of the model's attention."""
        c = self.model_config
        heads = int(c["num_attention_heads"])
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
        return heads, int(c.get("num_key_value_heads") or heads), head_dim

    def _attention_dtype(self) -> torch.dtype:
        # The attention runs in 16 bits (training.fast.attention), fp32 weights or not.
        return torch.float16 if self.args.fp16 else torch.bfloat16

    def _warm_cudnn(self) -> None:
        """cuDNN's attention plans for every record count a packed row can have, before the first step."""
        from training.fast.attention import bound_cudnn_totals, record_bucket, warm_cudnn

        bound_cudnn_totals(self.fast.packing_tokens)  # one backward plan per record count, for every row width
        a = self.args
        items = getattr(self.train_ds, "items", None)  # tokenized up front; a lazy data set has no lengths yet
        shortest = min((len(e.input_ids) for e in items), default=1) if items is not None else 16
        most = record_bucket(self.fast.packing_tokens // max(shortest, 1) + 2)  # + the padding tail's segments
        n, secs = warm_cudnn(*self._attention_shape(), self._attention_dtype(), self.device, a.model_max_length, most)
        log.info("cuDNN attention: plans for rows of up to %d records (%d sizes) built in %.1f s", most, n, secs)

    def trainable_params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _build_optimizer(self) -> None:
        a, env = self.args, self.env
        from transformers import get_scheduler

        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

        def is_matrix(p) -> bool:
            return len(getattr(p, "ds_shape", p.shape)) >= 2  # ZeRO-3 shards are flat; ds_shape is the real one

        # No weight decay on biases and norm weights (1-D), as in HF Trainer.
        groups = [
            {"params": [p for n, p in named if is_matrix(p)], "weight_decay": a.weight_decay},
            {"params": [p for n, p in named if not is_matrix(p)], "weight_decay": 0.0},
        ]
        groups = [g for g in groups if g["params"]]
        warmup = math.ceil(a.warmup_ratio * self.total_steps)

        def make_scheduler(optimizer):
            return get_scheduler(a.lr_scheduler_type, optimizer, num_warmup_steps=warmup,
                                 num_training_steps=self.total_steps)

        if a.deepspeed:
            import deepspeed

            optimizer = None
            if "optimizer" not in self.ds_config:
                # The client optimizer: DeepSpeed steps it on its flat fp32 partitions, so fused AdamW is one
                # kernel over each partition.
                fused = self.fast.fused_adamw  # on CUDA by default; on CPU as given (torch has a CPU kernel too)
                optimizer = torch.optim.AdamW(groups, lr=a.learning_rate, betas=(a.adam_beta1, a.adam_beta2),
                                              eps=a.adam_epsilon, fused=fused or None)
            else:
                self.fast.fused_adamw = False
                self.fast.why["fused_adamw"] = "off: the DeepSpeed config names its own optimizer"
            # With our loss the engine wraps model + loss, so its forward (and ZeRO-3's gathering) is what runs.
            self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
                model=self.loss_module if self.loss_module is not None else self.model, optimizer=optimizer,
                model_parameters=groups if optimizer is None else None,
                lr_scheduler=make_scheduler, config=self.ds_config,
            )
            if self.stage == 3:
                self._place_shards()
            return
        from training.fast.optim import fused_supported

        fused = self.fast.fused_adamw and fused_supported(p for _, p in named)
        if self.fast.fused_adamw and not fused:
            log.warning("fused AdamW is not supported for these parameters; using the default AdamW")
        self.fast.fused_adamw = fused
        self.optimizer = torch.optim.AdamW(groups, lr=a.learning_rate, betas=(a.adam_beta1, a.adam_beta2),
                                           eps=a.adam_epsilon, fused=fused or None)
        self.scheduler = make_scheduler(self.optimizer)
        if a.fp16:
            self.scaler = torch.amp.GradScaler("cuda")
        if env.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            # With our loss, DDP wraps model + loss, so the forward that DDP sees is the one that runs.
            self.ddp = DistributedDataParallel(
                self.loss_module if self.loss_module is not None else self.model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
            )

    def _place_shards(self) -> None:
        """ZeRO-3: a 4-bit base's quantization constants follow its shards to the GPU; each rank says how much of the
        frozen base it holds (about 1/world of it)."""
        from training.model import shard_quantized_base

        if self.method == "qlora":
            shard_quantized_base(self.model, self.device)
        frozen = [p for p in self.model.parameters() if not p.requires_grad and hasattr(p, "ds_tensor")]
        held = sum(p.ds_tensor.numel() for p in frozen)
        total = sum(p.ds_numel for p in frozen)
        by_rank = [int(x) for x in dist.all_gather_floats(float(held), self.device)]
        self.base_partition = {"held_by_rank": by_rank, "total": total}  # into the start record
        if total and self.env.is_main:
            log.info("ZeRO-3: the frozen base's %d stored elements held as %s by rank (%s)", total, by_rank,
                     ", ".join(f"{100 * h / total:.1f}%" for h in by_rank))

    def _build_loader(self) -> None:
        a, env = self.args, self.env
        pad_id = self.tokenizer.pad_token_id
        self.collator = Collator(pad_id, pad_to_multiple_of=8 if self.device.type == "cuda" else 1)
        collate = _records_of if self.fast.packing else self.collator
        self.sampler = StepSampler(len(self.train_ds), env.world_size, env.rank, a.per_device_train_batch_size,
                                   a.gradient_accumulation_steps, a.seed, self.total_steps, start_step=self.step)
        self.loader = torch.utils.data.DataLoader(
            self.train_ds, batch_sampler=self.sampler, collate_fn=collate,
            num_workers=a.dataloader_num_workers, pin_memory=self.device.type == "cuda",
            # Its own generator: a loader seeds its workers from the global RNG otherwise, and a
            # resumed run would then draw different dropout masks than an uninterrupted one.
            generator=torch.Generator().manual_seed(a.seed),
        )

    # ------------------------------------------------------------- the loop
    @property
    def wrapped(self):
        """What the forward pass goes through: the DeepSpeed engine, DDP, or the bare model."""
        return next(m for m in (self.engine, self.ddp, self.model) if m is not None)

    @property
    def unwrapped(self):
        return self.model  # the engine (or DDP) wraps it, or model + loss, without copying it

    def _autocast(self):
        a = self.args
        if self.engine is None and (a.bf16 or a.fp16):
            return torch.autocast(self.device.type, dtype=torch.bfloat16 if a.bf16 else torch.float16)
        return contextlib.nullcontext()

    def _forward_loss(self, batch: dict, num_items: torch.Tensor, train: bool = True) -> torch.Tensor:
        """Summed token cross-entropy / num_items: our loss (training.fast) or HF's own."""
        if self.loss_module is not None:
            # DDP or the DeepSpeed engine wraps the loss module; evaluation goes around DDP (no gradient sync), and
            # through the engine (ZeRO-3 gathers the weights in its hooks).
            module = (self.engine if self.engine is not None
                      else self.ddp if (train and self.ddp is not None) else self.loss_module)
            with self._autocast():
                loss_sum, _ = module(batch)
            return loss_sum / num_items
        with self._autocast():
            out = self.wrapped(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               labels=batch["labels"], num_items_in_batch=num_items, use_cache=False)
        return out.loss

    def train(self) -> None:
        gas = self.args.gradient_accumulation_steps
        self.wrapped.train()
        # The tokenized records, the model and the tokenizer are millions of long-lived Python objects; a full
        # garbage collection walks all of them, tens of milliseconds at an arbitrary step while the GPU waits.
        # Frozen, the collector skips them (what the loop itself allocates is still collected).
        gc.collect()
        gc.freeze()
        batches = iter(self.loader)
        # Packing runs one step ahead on a thread (the next step's job starts once this step's first micro-batch
        # is queued on the GPU), so the GPU does not wait for Python between steps.
        packer = ThreadPoolExecutor(1, thread_name_prefix="pack") if self.fast.packing else None

        def pack_next():
            return packer.submit(lambda: self._pack_cpu([e for _ in range(gas) for e in next(batches)]))

        pending = pack_next() if packer else None
        try:
            self._train_loop(batches, pending, pack_next)
        finally:
            if packer:
                packer.shutdown(wait=True, cancel_futures=True)

    def _train_loop(self, batches, pending, pack_next) -> None:
        a, env = self.args, self.env
        gas = a.gradient_accumulation_steps
        self._window = _Window()
        t_start = time.perf_counter()
        queued = None  # with --overlap_steps: the last step, queued on the GPU and not yet read back
        try:
            while self.step < self.total_steps:
                if queued is not None and a.profile_step == self.step + 1:
                    # Read back before the profiler starts: its start-up would count as the queued step's time.
                    self._record_step(queued, seconds=None)
                    queued = None
                prof = profiling.start(self.device) if a.profile_step == self.step + 1 and env.is_main else None
                mark = profiling.marker(prof)
                t0 = time.perf_counter()
                with mark("step: inputs"):
                    if self.fast.packing:
                        packed, pending = pending.result(), None
                        micro, counts = self._packed_step(packed)
                    else:
                        micro = [{k: v.to(self.device, non_blocking=True) for k, v in next(batches).items()}
                                 for _ in range(gas)]
                        # Supervised and real tokens of the whole optimizer step, over all ranks: the loss divisor.
                        counts = torch.tensor([sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in micro),
                                               sum(int(b["attention_mask"].sum()) for b in micro),
                                               sum(int(b["truncated"]) for b in micro), 0], dtype=torch.float64)
                    if dist.active() and not self.fast.packing:  # packed steps come with all ranks' counts
                        counts = dist.all_reduce_sum(counts.to(self.device)).cpu()
                    n_labels, n_tokens, n_trunc, n_empty = counts.tolist()
                    # DDP and DeepSpeed average gradients over ranks; scaling by world size turns that into a sum.
                    num_items = self._device_scalar(max(n_labels, 1.0) / env.world_size)
                    loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
                    lr = self._current_lr()
                for i, batch in enumerate(micro):
                    last = i == len(micro) - 1
                    if self.engine is not None and self.fast.packing:
                        # A packed step has as many rows as its records need (the same on every rank), not the
                        # configured accumulation count: the engine is told which one ends the step.
                        self.engine.set_gradient_accumulation_boundary(last)
                    sync = contextlib.nullcontext() if (last or self.ddp is None) else self.ddp.no_sync()
                    with sync:
                        with mark("step: forward"):
                            loss = self._forward_loss(batch, num_items)
                        with mark("step: backward"):
                            self._backward(loss)
                    if pending is None and self.fast.packing and self.step + 1 < self.total_steps:
                        # The next step is packed from here on: with this micro-batch's kernels queued, the packing
                        # thread's Python runs while the main thread waits on the GPU. Started with the step, it
                        # held the GIL while the main thread had the first kernels to launch, and the GPU idled.
                        pending = pack_next()
                    if queued is not None:
                        # The previous step is read back only now, with this step's first micro-batch queued: the
                        # GPU works on it while the host waits, logs and writes metrics.
                        with mark("step: previous step's metrics"):
                            self._record_step(queued, seconds=t0 - queued.t0)
                        queued = None
                    if self.engine is not None:
                        self.engine.step()  # DeepSpeed counts micro-batches and updates on the last one
                    loss_sum += loss.detach().double() * num_items.double()
                with mark("step: optimizer"):
                    grad_norm = self._optimizer_step()
                self.step += 1
                loss_sum = dist.all_reduce_sum(loss_sum)
                done = _Queued(self.step, loss_sum, grad_norm, lr, n_labels, n_tokens, n_trunc, n_empty, len(micro), t0)
                due_eval = a.eval_steps > 0 and self.eval_ds is not None and self.step % a.eval_steps == 0
                if (self.fast.overlap_steps and prof is None and self.step < self.total_steps and not due_eval
                        and not self._should_save()):
                    queued = done
                    continue
                self._record_step(done, seconds=None)  # reads the step back: waits for the GPU
                if prof is not None:
                    out = Path(a.output_dir) / f"profile-step{self.step}.txt"
                    trace = out.with_suffix(".json.gz") if a.profile_trace else None
                    text = profiling.finish(prof, self.device, out, time.perf_counter() - t0, trace=trace)
                    log.info("profile of step %d (%s):\n%s", self.step, out, text)
                if due_eval:
                    self.evaluate()
                if self._should_save():
                    self.save_checkpoint()
        except BaseException:
            if queued is not None:  # a step that finished before the failure still gets its metrics record
                self._flush_after_error(queued)
            raise
        self.train_runtime = time.perf_counter() - t_start

    def _record_step(self, q: "_Queued", seconds: float | None) -> None:
        """Reads a finished step's loss and gradient norm back and logs it (every --logging_steps). seconds: the
        step's share of the wall time, or None to take it from the step's start until now, after the read-back."""
        a = self.args
        loss_sum = q.loss_sum.item()
        grad_norm = float(q.grad_norm)
        if seconds is None:
            seconds = time.perf_counter() - q.t0
        if q.n_trunc and a.lazy_preprocess:
            self.lazy_truncated += int(q.n_trunc)
            if self.env.is_main:
                log.warning("step %d: %d record(s) longer than --model_max_length %d were truncated",
                            q.step, int(q.n_trunc), a.model_max_length)
        w = self._window
        w.add(loss_sum, q.n_labels, q.n_tokens, seconds)
        w.micro_batches += q.micro_batches
        w.empty_rows += int(q.n_empty)
        if q.step % a.logging_steps == 0 or q.step == self.total_steps:
            self._log_step(w, q.step, q.lr, grad_norm)
            self._window = _Window()

    def _flush_after_error(self, q: "_Queued") -> None:
        try:
            self._record_step(q, seconds=None)
        except Exception as e:  # the device may be what failed; the original error is what gets raised
            log.warning("step %d's metrics could not be read back after the failure: %s", q.step, e)

    def _device_scalar(self, x: float) -> torch.Tensor:
        """A float32 scalar on the device without a synchronisation: a copy from pageable memory would wait for
        every queued kernel, so on CUDA it goes through pinned memory."""
        t = torch.tensor(x, dtype=torch.float32)
        if self.device.type != "cuda":
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def _pack_cpu(self, items: list) -> tuple[list[dict], list[float], int]:
        """The CPU half of a packed step (runs on the packing thread): this rank's rows, pinned on CUDA; the
        supervised tokens, real tokens, truncated records and empty rows of all ranks; and the rows every rank
        runs (the busiest rank's count). Several ranks agree on these here, on the host, a step ahead."""
        f, a = self.fast, self.args
        pad_id = self.tokenizer.pad_token_id
        rows = fastpath.pack_step(items, f.packing_tokens, pad_id, self._pad_multiple, a.model_max_length)
        if self.device.type == "cuda":
            rows = [{k: (v.pin_memory() if isinstance(v, torch.Tensor) else v) for k, v in r.items()} for r in rows]
        counts = [float(sum(sum(1 for x in e.labels[1:] if x != IGNORE_INDEX) for e in items)),
                  float(sum(len(e.input_ids) for e in items)), float(sum(int(e.truncated) for e in items))]
        if self.meta_group is None:
            return rows, counts + [0.0], len(rows)
        ranks = dist.gather_floats(counts + [float(len(rows))], self.meta_group)
        most = int(max(r[3] for r in ranks))
        totals = [sum(r[i] for r in ranks) for i in range(3)]
        return rows, totals + [most * len(ranks) - sum(r[3] for r in ranks)], most

    @property
    def _pad_multiple(self) -> int:
        # Rows are as wide as their records rounded up to this: tile-friendly widths on CUDA with at most 127 tokens
        # of padding a row (the compiled layers are shape-dynamic, so widths cost no recompiles).
        return 128 if self.device.type == "cuda" else 8

    def _packed_step(self, packed: tuple[list[dict], list[float], int]) -> tuple[list[dict], torch.Tensor]:
        """A step's packed rows on the device, as many as the busiest rank has (the others get empty rows: DDP
        needs the same number of forwards everywhere), with the counts of all ranks (see _pack_cpu)."""
        f, a = self.fast, self.args
        rows, counts, n_rows = packed
        if len(rows) < n_rows:
            filler = fastpath.empty_row(min(self._pad_multiple, f.packing_tokens), self.tokenizer.pad_token_id,
                                        a.model_max_length)
            rows = rows + [filler] * (n_rows - len(rows))
        micro = [{k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in r.items()}
                 for r in rows]
        return micro, torch.tensor(counts, dtype=torch.float64)

    def _current_lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def _backward(self, loss: torch.Tensor) -> None:
        if self.engine is not None:
            self.engine.backward(loss, scale_wrt_gas=False)  # our loss is already normalised per step
        elif self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def _optimizer_step(self) -> torch.Tensor | float:
        a = self.args
        if self.engine is not None:
            norm = self.engine.get_global_grad_norm()  # engine.step() already ran with the last micro-batch
            return float(norm) if norm is not None else float("nan")
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        max_norm = a.max_grad_norm if a.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.trainable_params(), max_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm  # on the device: _record_step reads it back (with --overlap_steps, a step later)

    def _log_step(self, w: "_Window", step: int, lr: float, grad_norm: float) -> None:
        rec = {
            "step": step,
            "epoch": round(step / self.steps_per_epoch, 4),
            "loss": w.loss_sum / max(w.labels, 1.0),
            "learning_rate": lr,
            "grad_norm": grad_norm,
            "tokens": int(w.tokens),
            "label_tokens": int(w.labels),
            "tokens_per_second": w.tokens / w.seconds if w.seconds > 0 else None,
            "step_time": w.seconds / w.steps,
        }
        if self.fast.packing:
            rec["micro_batches"] = w.micro_batches  # packed rows each process ran, empty ones included
            rec["empty_rows"] = w.empty_rows  # rows of padding, over all processes, so all ran as many
        if self.device.type == "cuda":
            rec["peak_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            # Each retry freed the allocator's cache mid-step: a device-wide synchronisation (training.fast.allocator).
            rec["alloc_retries"] = allocator.retries(self.device)
            if rec["alloc_retries"] > self._retries_warned:
                log.warning("the CUDA allocator freed its cache and retried %d time(s) so far (each one stalls the "
                            "GPU): %s", rec["alloc_retries"],
                            "lower --auto_memory_fraction" if self.fast.expandable_segments
                            else "use --expandable_segments or a lower --auto_memory_fraction")
                self._retries_warned = rec["alloc_retries"]
        self.metrics.write(rec)
        log.info("step %d/%d loss %.4f lr %.3g grad_norm %.3f %.0f tok/s", step, self.total_steps,
                 rec["loss"], lr, grad_norm, rec["tokens_per_second"] or 0.0)

    def _should_save(self) -> bool:
        a = self.args
        if a.save_strategy == "steps":
            return self.step % a.save_steps == 0
        if a.save_strategy == "epoch":
            return self.step % self.steps_per_epoch == 0
        return False

    # ----------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self) -> float:
        """Token-mean loss on --eval_data_path over all ranks; logged as an {"event": "eval"} record."""
        a, env = self.args, self.env
        self.wrapped.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for idx in eval_batches(len(self.eval_ds), env.world_size, env.rank, a.per_device_eval_batch_size):
            # A rank without records left still runs a forward (ZeRO-3 gathers weights collectively).
            batch = self.collator([self.eval_ds[i] for i in (idx or [0])])
            if not idx:
                batch["labels"].fill_(IGNORE_INDEX)
            batch = {k: v.to(self.device) for k, v in batch.items()}
            loss = self._forward_loss(batch, torch.tensor(1.0, device=self.device), train=False)
            total += torch.stack([loss.detach().double(), (batch["labels"] != IGNORE_INDEX).sum().double()])
        total = dist.all_reduce_sum(total)
        self.wrapped.train()
        eval_loss = (total[0] / total[1].clamp(min=1)).item()
        self.metrics.write({"event": "eval", "step": self.step, "eval_loss": eval_loss, "eval_tokens": int(total[1])})
        log.info("eval at step %d: loss %.4f over %d tokens", self.step, eval_loss, int(total[1]))
        return eval_loss

    # ------------------------------------------------------------ checkpoints
    @property
    def is_saver(self) -> bool:
        """The process that writes shared files: rank 0, or each node's first process with --save_on_each_node."""
        return self.env.local_rank == 0 if self.args.save_on_each_node else self.env.is_main

    def save_model(self, out: Path) -> None:
        """Writes the model (or the LoRA adapter) and tokenizer in HF format. Collective under ZeRO-3."""
        if self.stage == 3:
            state_dict = self._gather_zero3_state_dict(trainable_only=self.method != "full")
            if self.is_saver:
                save_pretrained_here(self.unwrapped, out, state_dict=state_dict)
                self.tokenizer.save_pretrained(out)
        elif self.is_saver:
            save_pretrained_here(self.unwrapped, out)
            self.tokenizer.save_pretrained(out)

    def _gather_zero3_state_dict(self, trainable_only: bool) -> dict | None:
        """The full weights of a ZeRO-3 model (only the trainable ones for LoRA), gathered one module at a time on
        every rank; the savers keep a CPU copy (the others get None). DeepSpeed's own consolidation hands them to
        global rank 0 alone, so with --save_on_each_node the other nodes would have had no model to write."""
        import deepspeed

        keep = self.is_saver
        state, copies = {}, {}
        for prefix, module in self.unwrapped.named_modules():
            params = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad or not trainable_only]
            if params:
                with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
                    for n, p in params:
                        if keep:  # a tied weight is one tensor under both names, as save_pretrained expects
                            if id(p) not in copies:
                                copies[id(p)] = p.data.detach().to("cpu", copy=True)
                            state[f"{prefix}.{n}" if prefix else n] = copies[id(p)]
            if keep and not trainable_only:
                for n, b in module.named_buffers(recurse=False):
                    if b is not None and n not in module._non_persistent_buffers_set:
                        state[f"{prefix}.{n}" if prefix else n] = b.detach().to("cpu", copy=True)
        return state if keep else None

    def save_checkpoint(self) -> None:
        a, env = self.args, self.env
        tmp, final = ckpt.staging_dir(a.output_dir, self.step)
        if self.is_saver:
            ckpt.clear(tmp)  # left over from a run that died mid-save
            tmp.mkdir(parents=True)
        dist.barrier()
        tmp.mkdir(parents=True, exist_ok=True)  # a rank on a node without shared storage
        if self.engine is not None:
            self.engine.save_checkpoint(str(tmp), tag="ds", exclude_frozen_parameters=self.method != "full")
        elif self.is_saver:
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            if self.scaler is not None:
                torch.save(self.scaler.state_dict(), tmp / "scaler.pt")
        torch.save(_rng_state(), tmp / f"rng_state_{env.rank}.pth")
        self.save_model(tmp)
        if self.is_saver:
            ckpt.write_json(tmp / ckpt.STATE_FILE, {
                "step": self.step, "epoch": self.step / self.steps_per_epoch, "total_steps": self.total_steps,
                "global_batch_size": self.global_batch, "world_size": env.world_size, "method": self.method,
                "zero_stage": self.stage, "seed": a.seed, "model": a.model_name_or_path, "time": time.time(),
            })
        dist.barrier()
        if self.is_saver:
            ckpt.publish(tmp, final)
            for gone in ckpt.rotate(a.output_dir, a.save_total_limit):
                log.info("deleted %s (--save_total_limit %d)", gone, a.save_total_limit)
        dist.barrier()
        if env.is_main:
            self.metrics.write({"event": "checkpoint", "step": self.step, "path": str(final)})
        log.info("saved %s", final)

    def _load_training_state(self) -> None:
        """Restores optimizer, scheduler and (for DeepSpeed) weights; model weights of plain runs came with the model."""
        d = self.resume_dir
        if self.engine is not None:
            path, _ = self.engine.load_checkpoint(str(d), tag="ds", load_module_strict=self.method == "full")
            if path is None:
                raise InputError(f"{d}: no DeepSpeed state in the checkpoint (was it written without --deepspeed?)")
        else:
            if not (d / "optimizer.pt").is_file():
                raise InputError(f"{d}: no optimizer.pt (was it written with --deepspeed?)")
            self.optimizer.load_state_dict(torch.load(d / "optimizer.pt", map_location=self.device, weights_only=True))
            self.scheduler.load_state_dict(torch.load(d / "scheduler.pt", weights_only=True))
            if self.scaler is not None and (d / "scaler.pt").is_file():
                self.scaler.load_state_dict(torch.load(d / "scaler.pt", weights_only=True))
        rng = d / f"rng_state_{self.env.rank}.pth"
        if rng.is_file():
            _set_rng_state(torch.load(rng, weights_only=False))
        else:
            log.warning("%s: no RNG state for rank %d; dropout will not repeat exactly", d, self.env.rank)
        log.info("resumed from %s at step %d", d, self.step)

    def save_final(self) -> None:
        """The trained model (or adapter) into output_dir, plus output_dir/merged with --merge_lora."""
        a = self.args
        out = Path(a.output_dir)
        tmp = out / ".final.tmp"
        if self.is_saver:
            ckpt.clear(tmp)
            tmp.mkdir(parents=True)
        dist.barrier()
        self.save_model(tmp)
        dist.barrier()
        if self.is_saver:
            ckpt.move_contents(tmp, out)
            if a.merge_lora:
                merged_tmp, merged = out / ".merged.tmp", out / "merged"
                ckpt.clear(merged_tmp)
                dtype = torch.bfloat16 if a.bf16 else torch.float16 if a.fp16 else torch.float32
                merge_adapter(self.source, str(out), str(merged_tmp), dtype, self.tokenizer)
                ckpt.clear(merged)
                os.rename(merged_tmp, merged)
                log.info("saved the merged model in %s", merged)
        dist.barrier()
        log.info("saved the final %s in %s", "adapter" if self.method != "full" else "model", out)

    # ----------------------------------------------------------------- end
    def replica_checksums(self) -> list[float] | None:
        """One number per rank summarising the trainable weights: equal when the replicas stayed in step.

        Not meaningful under ZeRO-3, where every rank holds a different shard.
        """
        if self.stage == 3:
            return None
        total = 0.0
        with torch.no_grad():
            for i, p in enumerate(self.trainable_params()):
                total += (p.double().sum() + (i + 1) * 1e-3 * p.double().pow(2).sum()).item()
        return dist.all_gather_floats(total, self.device)

    def finish(self) -> None:
        sums = self.replica_checksums()
        trunc = self.lazy_truncated if self.args.lazy_preprocess else self.train_ds.stats.truncated
        self.metrics.write({
            "event": "end", "status": "ok", "step": self.step, "total_steps": self.total_steps,
            "train_runtime": getattr(self, "train_runtime", None), "truncated_records": trunc,
            "replica_checksums": sums, "replicas_in_sync": None if sums is None else len(set(sums)) == 1,
            "output_dir": os.path.abspath(self.args.output_dir),
        })

    def fail(self, error: BaseException) -> None:
        if self.started and self.metrics is not None:
            self.metrics.write({"event": "end", "status": "error", "step": self.step,
                                "error": f"{type(error).__name__}: {error}"})

    def cleanup(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.engine is not None:
            self.engine.destroy()  # releases ZeRO-3's hooks and threads before the process group goes
        self.ddp = None  # DDP's reducer holds the process group: let it go first
        # train() froze the long-lived objects out of the collector; a reducer caught in a reference cycle
        # would then outlive the process group and abort the process at exit ("terminate called ...").
        gc.unfreeze()
        gc.collect()
        dist.destroy()


@dataclass
class _Queued:
    """A finished optimizer step whose loss and gradient norm may still be on the device."""
    step: int
    loss_sum: torch.Tensor
    grad_norm: torch.Tensor | float
    lr: float
    n_labels: float
    n_tokens: float
    n_trunc: float
    n_empty: float
    micro_batches: int
    t0: float


class _Window:
    """Sums over the optimizer steps between two metrics records."""

    def __init__(self):
        self.loss_sum = self.labels = self.tokens = self.seconds = 0.0
        self.steps = self.micro_batches = self.empty_rows = 0

    def add(self, loss_sum: float, labels: float, tokens: float, seconds: float) -> None:
        self.loss_sum += loss_sum
        self.labels += labels
        self.tokens += tokens
        self.seconds += seconds
        self.steps += 1


def _records_of(items: list) -> list:
    """collate_fn of packed training: the records themselves (the loop packs a whole step at once)."""
    return list(items)


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
