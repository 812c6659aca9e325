"""The fine-tuning recipe: set-up, evaluation and the end of a run; it wires the components of its rooms:
training.builders (model, optimizer or DeepSpeed engine or DDP, data loader, each from its slice of the flags),
training.fast.apply (the fast path on the built model), training.step_loop (the loop), training.checkpoints.checkpointer
(checkpoints, resume and the final save).

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
import uuid

import torch

from training import builders, dsconfig
from training.checkpoints import directories as ckpt
from training.checkpoints import shared_output
from training.checkpoints.checkpointer import Checkpointer
from training.data.batches import build_dataset, eval_batches
from training.data.encoding import IGNORE_INDEX, ChatEncoder, log_stats
from training.data.records import load_conversations
from training.fast import apply, choice, fp8, fp8_watch, long_context, sequence_parallel
from training.fast.apply import FastLoss
from training.fast.preference import PreferenceLoss
from training.flags import Resolved, WorkerFlags
from training.model.pretrained import (
    check_method,
    load_tokenizer,
    quantization_method,
    read_config_dict,
    resolve_model_source,
)
from training.runtime import dist, trackers, unused_imports
from training.runtime.errors import InputError
from training.runtime.heartbeat import NoHeartbeat
from training.runtime.metrics import MetricsWriter
from training.runtime.step_timing import StepTimer
from training.step_loop import LoopResult, LoopState, StepLoop, StepLoss

log = logging.getLogger("training")


class FinetuneRecipe:
    """args: the flags as given; resolved: what set-up decides of them (training.flags.Resolved), settled in
    setup() and read by the components that run after it. Each component gets the flag groups it reads."""

    def __init__(self, args: WorkerFlags, resolved: Resolved, heartbeat=None):
        self.args = args
        self.resolved = resolved
        self.heartbeat = heartbeat or NoHeartbeat()  # training.runtime.heartbeat: the phase this rank is in
        self.timer: StepTimer | None = None
        self.timing_group = None  # the logging gather's gloo group (several ranks)
        self.env = dist.read_env()
        self.metrics: MetricsWriter | None = None
        self.started = False
        self.start_step = 0  # 0, or the resumed checkpoint's step
        self.loop: StepLoop | None = None  # while and after training: the step it reached
        self.trained: LoopResult | None = None  # what the loop produced
        self.engine = None  # the DeepSpeed engine, when --deepspeed is given
        self.loss_module = None  # model + our loss (training.fast), when the fast path computes the loss
        self.ddp = None
        self.scaler = None
        self._hf_ds_config = None  # keeps transformers' ZeRO-3 hook alive while loading
        self.meta_group = None  # the packing thread's gloo group (several ranks, packing)
        self.base_partition = None  # ZeRO-3: how much of the frozen base each rank holds
        self.router = None  # mixture of experts: the routers' logits and their load-balancing loss (training.model.moe)
        # What setup() finds out and builds, in its order; None until it has run.
        self.ds_raw = None  # the DeepSpeed config as given
        self.stage = 0  # its ZeRO stage (0 without --deepspeed)
        self.device: torch.device | None = None
        self.resume_dir = None  # the checkpoint this run continues from, and its saved state
        self.resume_state: dict | None = None
        self.source = None  # the model's local directory
        self.model_config: dict | None = None
        self.quant = None  # the checkpoint's own quantization (GPTQ, AWQ), if any
        self.method = None  # full, lora or qlora
        self.fast = None  # the fast path's switches (training.fast.choice)
        self.data_env = None  # ranks as the data sees them (one per sequence-parallel group)
        self.tokenizer = None
        self.train_ds = None
        self.eval_ds = None
        self.global_batch = 0
        self.steps_per_epoch = 0
        self.total_steps = 0
        self.lineage = ""  # one id for a run and every run resumed from it
        self.ds_config = None  # the DeepSpeed config with its 'auto' fields filled
        self.model = None
        self.optimizer = None
        self.scheduler = None
        self.collator = None
        self.sampler = None
        self.loader = None
        self.checkpointer: Checkpointer | None = None
        self.pairs = False  # DPO (--stage dpo): the data are preference pairs
        self.reference_timing: dict | None = None  # DPO: the reference pass's rows, tokens and seconds on this rank
        self.data_sources: list[dict] | None = None  # --datasets: each source's name, format and records taken
        self.fp8_layers: fp8.Fp8Layers | None = None  # the layers --fp8 converted (training.fast.fp8)
        self.fp8_watch: fp8_watch.Fp8Watch | None = None  # their profiled step and loss guard

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        a, env = self.args, self.env
        # 1. Cheap checks of the input, in the order a user would fix them.
        self.ds_raw = dsconfig.load(a.train.deepspeed) if a.train.deepspeed else None
        self.stage = dsconfig.zero_stage(self.ds_raw)
        self.device = dist.pick_device(env, a.train.use_cpu)
        if a.train.deepspeed and self.device.type == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # also when --use_cpu on a GPU machine
        self.pairs = a.pref.stage == "dpo"
        train_convs = self._load_records()
        eval_convs = self._load_records(a.data.eval_data_path) if a.data.eval_data_path else None
        if a.save.save_on_each_node:  # resolved at run time: a node-local copy each, unless output_dir turns out
            # to be one directory for all nodes (bounded by the collectives' timeout)
            self.resolved.save_on_each_node = shared_output.decide(a.train.output_dir, float(a.train.ddp_timeout))
        self.resume_dir = ckpt.resolve_resume(a.save.resume_from_checkpoint, a.train.output_dir)
        self.resume_state = ckpt.read_state(self.resume_dir) if self.resume_dir else None
        self.source = resolve_model_source(a.model.model_name_or_path, env.local_rank)
        self.model_config = read_config_dict(self.source)
        self.quant = quantization_method(self.model_config)
        self.method = check_method(a.lora, a.model.model_name_or_path, a.train.fp16, self.model_config,
                                   self.device.type == "cuda", self.stage)
        self.fast = choice.decide(a.fast, a.lora, half=bool(a.train.bf16 or a.train.fp16), device=self.device,
                                  deepspeed=bool(a.train.deepspeed), zero_stage=self.stage,
                                  expandable=self.resolved.expandable_segments,
                                  expandable_why=self.resolved.expandable_why)
        from training.model import moe

        # FP8 matmuls (training.fast.fp8): an explicit --fp8 on that cannot run here fails now, before anything runs
        self.fast.fp8, self.fast.why["fp8"] = fp8.decide(
            a.fast.fp8, method=self.method, model_config=self.model_config, device=self.device,
            bf16=bool(a.train.bf16), compiled=self.fast.compile, moe=moe.moe_shape(self.model_config) is not None,
            deepspeed=bool(a.train.deepspeed),
            rows=a.fast.packing_tokens // a.train.sequence_parallel_size if a.fast.packing_tokens else None)
        sequence_parallel.check_shape(a.train.sequence_parallel_size, env.world_size, self.model_config)
        sequence_parallel.check_fast_path(a.train.sequence_parallel_size, a.fast, self.fast)
        # resolves --tiled_mlp, and for the longest records --packing_tokens and --gradient_checkpointing
        long_context.decide(self.resolved, self.fast, env.world_size, self.stage if a.train.deepspeed else None,
                            bool(a.train.deepspeed), train=a.train, given=a.fast, max_length=a.data.model_max_length,
                            sequences=(PreferenceLoss if a.pref.stage == "dpo" else FastLoss).SEQUENCES)
        self.data_env = sequence_parallel.data_env(env, a.train.sequence_parallel_size)  # one data rank per SP group

        # 2. Tokenize (or, with --lazy_preprocess, only check) the data and plan the steps.
        self.tokenizer = load_tokenizer(self.source)
        encoder = ChatEncoder(self.tokenizer, a.data.model_max_length)
        if self.pairs:
            from training.data.pairs import build_pair_dataset

            self.train_ds = build_pair_dataset(train_convs, encoder)
            self.eval_ds = build_pair_dataset(eval_convs, encoder) if eval_convs else None
            self.train_ds.key = train_convs.sha256
            if self.eval_ds is not None:
                self.eval_ds.key = eval_convs.sha256
        else:
            self.train_ds = build_dataset(train_convs, encoder, a.data.lazy_preprocess)
            self.eval_ds = build_dataset(eval_convs, encoder, a.data.lazy_preprocess) if eval_convs else None
        if env.is_main:  # every rank tokenizes the same data: one report is enough
            log_stats(self.train_ds.stats, self.data_label, "pairs" if self.pairs else "records",
                      a.data.lazy_preprocess, a.data.model_max_length)
        mb, gas = a.train.per_device_train_batch_size, a.train.gradient_accumulation_steps
        self.global_batch = self.data_env.world_size * mb * gas
        self.steps_per_epoch = len(self.train_ds) // self.global_batch
        if self.steps_per_epoch == 0:
            who = "processes" if a.train.sequence_parallel_size == 1 else "sequence-parallel groups"
            raise InputError(f"{self.data_label}: {len(self.train_ds)} usable {'pairs' if self.pairs else 'records'}, fewer than one global batch "
                             f"of {self.global_batch} (= {self.data_env.world_size} {who} x "
                             f"{mb} x {gas} accumulation)")
        self.total_steps = (a.train.max_steps if a.train.max_steps > 0
                            else math.ceil(a.train.num_train_epochs * self.steps_per_epoch))
        if self.resume_state:
            self._check_resume_compatible()
            self.start_step = int(self.resume_state["step"])
        # Which checkpoints are this run's (rotation deletes only those): kept across resumes, new for a fresh start.
        self.lineage = (self.resume_state or {}).get("lineage") or uuid.uuid4().hex
        if self.resume_state and env.is_main:  # never silently: `auto` may find a checkpoint the user forgot
            st = self.resume_state
            log.info("resuming from %s (step %d%s)", self.resume_dir, self.start_step,
                     f", saved by run {st['run_id']}" if st.get("run_id") else "")

        hidden = int(self.model_config.get("hidden_size") or 4096)
        self.ds_config = (dsconfig.fill(a.train.deepspeed, self.ds_raw, a.train, env.world_size, hidden,
                                        self.device.type == "cpu", dsconfig.layer_numel(self.model_config),
                                        self.fast.compile, on_each_node=self.resolved.save_on_each_node)
                          if self.ds_raw else None)

        # 3. Processes, model, optimizer.
        if self.device.type == "cuda":
            dist.flight_recorder_defaults(a.save.heartbeat_dir)  # read when the NCCL process group starts
        dist.init(env, self.device, a.train.ddp_timeout, need_group=bool(a.train.deepspeed))
        # Packed steps agree on their rows and token counts on the packing thread, through a gloo group of their own.
        self.meta_group = dist.cpu_group(a.train.ddp_timeout) if self.fast.packing else None
        # The logging gather of every rank's compute and wait (training.runtime.step_timing), on the host and on a
        # group of its own: on the default NCCL group it would wait for the GPU work queued before it.
        self.timing_group = dist.cpu_group(a.train.ddp_timeout)
        if a.fast.fp8 != "off" and apply.any_rank(self.device, not self.fast.fp8) and self.fast.fp8:
            # every rank runs the same matmuls, or none does FP8 (the guard's collectives need them all)
            self.fast.fp8, self.fast.why["fp8"] = False, "off: another rank cannot run FP8 (" + \
                self.fast.why["fp8"] + " here)"
        if a.train.deepspeed:
            import deepspeed

            unused_imports.skip_deepspeed_cpu_shm_op(self.device.type)
            # Before the model loads: ZeRO-3 partitions weights while loading and must know the world.
            deepspeed.init_distributed(dist_backend="nccl" if self.device.type == "cuda" else "gloo")
        torch.manual_seed(a.train.seed)
        self.model, self._hf_ds_config = builders.build_model(
            self.source, self.method, self.device, self._load_dtype(), self.quant, self.stage, self.fast,
            self.resume_dir, self.ds_config, train=a.train, lora=a.lora, moe=a.moe, random_init=a.model.random_init,
            checkpointed=bool(self.resolved.gradient_checkpointing))
        self.router = self._router_aux()
        if self.fast.fp8:  # before ZeRO-3's leaf modules and the compiled layers, which must see the FP8 layers
            self.fp8_layers = fp8.convert(self.model, self.method, pad_inner_dim=self._fp8_pads())
            if env.is_main:
                fp8_watch.log_conversion(self.fp8_layers, self.stage)
        # Before the optimizer: DeepSpeed's hooks (ZeRO-3) and DDP must see the loss module and compiled layers.
        self.loss_module = apply.prepare(self.model, self.fast, self.model_config, self.device, self.stage,
                                         train=a.train, pref=a.pref, max_length=a.data.model_max_length,
                                         kernel=a.fast.attention_kernel, model_name=a.model.model_name_or_path,
                                         resolved=self.resolved)
        if a.train.sequence_parallel_size > 1:  # the packed attention inside Ulysses; rows shard from here on
            sequence_parallel.install(self.model, self.model_config, a.train.sequence_parallel_size, env.world_size,
                                      env.rank, self.tokenizer.pad_token_id, self.loss_module,
                                      float(a.train.ddp_timeout))
        if self.resolved.tiled_mlp:
            tiles = a.train.tiled_mlp_tokens
            log.info("tiled MLP: %d layers, tiles of %d tokens", long_context.tile_mlps(self.model, tiles), tiles)
        # Before the probes: its hook on layer 0 is then part of that layer's compiled graph from the first compile.
        self.timer = StepTimer(self.device, self.model, env.world_size > 1)
        if not a.train.deepspeed:
            self._size_rows()  # the probes add the optimizer states that are not there yet
            self._fp8_rows_check()  # before the optimizer and DDP, which then never see an FP8 layer
        opt = builders.build_optimization(a.train, a.hf.warmup_steps, env, self.model, self.loss_module, self.fast,
                                          self.ds_config, self.device, self.total_steps)
        self.optimizer, self.scheduler, self.engine, self.ddp, self.scaler = (
            opt.optimizer, opt.scheduler, opt.engine, opt.ddp, opt.scaler)
        if self.stage == 3:
            self.base_partition = builders.place_shards(self.model, self.method, self.device, env.is_main)
        if a.train.deepspeed:
            self._size_rows()  # the probes measure the engine's optimizer states and gradient buffers too
        if self.pairs:  # DPO's reference log-probabilities, once, before the first step (training.preference)
            from training.preference import attach_reference

            attach_reference(self)
        loading = builders.build_loader(a.train, a.data.dataloader_num_workers, self.data_env, self.train_ds,
                                        self.tokenizer.pad_token_id, self.device, self.fast.packing, self.total_steps,
                                        self.start_step)
        self.collator, self.sampler, self.loader = loading.collator, loading.sampler, loading.loader
        self.checkpointer = Checkpointer(env, self.stage, self.method, self.model, self.tokenizer, self.source,
                                         train=a.train, save_total_limit=a.save.save_total_limit,
                                         merge_lora=a.lora.merge_lora, on_each_node=self.resolved.save_on_each_node)
        if self.resume_dir:
            self.checkpointer.load_training_state(self.resume_dir, self.device, self.engine, self.optimizer,
                                                  self.scheduler, self.scaler, self.start_step)

        # 4. Only now does anything get written.
        os.makedirs(a.train.output_dir, exist_ok=True)
        self.metrics = MetricsWriter(a.save.metrics_file, enabled=env.is_main)
        self.metrics.write({
            "event": "start", "world_size": env.world_size, "stage": a.pref.stage, "data_sources": self.data_sources,
            "sequence_parallel_size": a.train.sequence_parallel_size, "method": self.method, "zero_stage": self.stage,
            "total_steps": self.total_steps, "start_step": self.start_step, "steps_per_epoch": self.steps_per_epoch,
            "global_batch_size": self.global_batch, "micro_batch_size": a.train.per_device_train_batch_size,
            "gradient_accumulation_steps": a.train.gradient_accumulation_steps, "model": a.model.model_name_or_path,
            "data": self.data_label, "records": self.train_ds.stats.records, "usable_records": len(self.train_ds),
            "truncated_records": self.train_ds.stats.truncated, "dropped_records": self.train_ds.stats.dropped,
            # every token and the supervised ones (None with --lazy_preprocess: counted as batches are made)
            "tokens": None if a.data.lazy_preprocess else self.train_ds.stats.tokens,
            "supervised_tokens": None if a.data.lazy_preprocess else self.train_ds.stats.label_tokens,
            "model_max_length": a.data.model_max_length, "device": self.device.type,
            "precision": "bf16" if a.train.bf16 else "fp16" if a.train.fp16 else "fp32",
            "resumed_from": str(self.resume_dir) if self.resume_dir else None,
            "trainable_parameters": sum(getattr(p, "ds_numel", p.numel()) for p in self.trainable_params()),
            "lazy_preprocess": a.data.lazy_preprocess, "fast_path": self.fast.record(),
            "base_partition": self.base_partition,
            # DPO: this rank's share of the reference pass (None when read back on a resume), what it cost
            "dpo_reference": self.reference_timing,
            "moe": None if self.router is None else {
                "experts": self.router.shape.num_experts, "experts_per_token": self.router.shape.top_k,
                "moe_layers": self.router.layers, "router_aux_loss_coef": self.router.coef,
                "shared_expert": self.router.shape.shared_expert, "train_router": bool(a.moe.train_router)},
        })
        if self.fp8_layers is not None:
            self.fp8_watch = self._fp8_watch()
            self.metrics.write(fp8_watch.conversion_record(
                self.fp8_layers, a.fast.fp8, self.fast.why["fp8"], self.stage, a.fast.fp8_guard_steps,
                a.fast.fp8_parity_bound, self.fp8_watch.profile_step))
        self.started = True
        if env.is_main:
            log.info("%s", self.fast.summary())
        log.info("training %s for %d steps (%d per epoch, global batch %d) on %d process(es), %s%s",
                 self.method, self.total_steps, self.steps_per_epoch, self.global_batch, env.world_size,
                 self.device.type, f", ZeRO-{self.stage}" if a.train.deepspeed else "")

    @property
    def data_label(self) -> str:
        """What the data is called in the log and the start record: the path, or the mixture's sources."""
        d = self.args.data
        return d.data_path or ", ".join(s["name"] for s in (self.data_sources or [])) or str(d.datasets)

    def _load_records(self, path: str | None = None):
        """The checked chat records (SFT) or preference pairs (DPO) of --data_path, --datasets or `path`."""
        d = self.args.data
        if path is None and d.datasets:
            from training.data.sources import load_mixture

            mix = load_mixture(d.datasets, self.args.train.seed, preference=self.pairs, default_format=d.data_format)
            self.data_sources = mix.summary
            return mix.records
        from training.data.records import load_pairs

        return load_pairs(path or d.data_path, d.data_format) if self.pairs else \
            load_conversations(path or d.data_path, d.data_format)

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
        half = torch.bfloat16 if a.train.bf16 else torch.float16 if a.train.fp16 else None
        if half is None:
            return torch.float32
        if a.train.deepspeed or self.method != "full":
            return half  # DeepSpeed keeps its own fp32 master copy; a LoRA base is frozen
        return torch.float32  # plain full fine-tuning: fp32 weights, autocast for the compute

    def _router_aux(self):
        """RouterAux for a mixture-of-experts model (None for a dense one): the config's coefficient unless
        --router_aux_loss_coef gives one; 0 collects nothing."""
        from training.model import moe

        shape = moe.moe_shape(self.model_config)
        if shape is None:
            if self.args.moe.router_aux_loss_coef is not None or self.args.moe.train_router:
                log.warning("--router_aux_loss_coef and --train_router apply to mixture-of-experts models only; "
                            "%s is dense", self.args.model.model_name_or_path)
            return None
        given = self.args.moe.router_aux_loss_coef
        coef = shape.aux_coef if given is None else float(given)
        router = moe.RouterAux(self.model, shape, coef)
        if self.env.is_main:
            log.info("mixture of experts: %d MoE layers of %d experts, %d a token%s; load-balancing loss x %g%s",
                     router.layers, shape.num_experts, shape.top_k, " + a shared expert" if shape.shared_expert
                     else "", coef, " (--router_aux_loss_coef)" if self.args.moe.router_aux_loss_coef is not None
                     else " (the model config's router_aux_loss_coef)")
        return router

    def _fp8_rows_check(self) -> None:
        """--fp8 auto's second look, once the rows are sized (training.fast.fp8.second_look)."""
        a = self.args
        if self.fp8_layers is None:
            return
        why = fp8.second_look(a.fast.fp8, self.fast, self.train_ds.stats, a.train, lazy=a.data.lazy_preprocess,
                              max_length=(2 if self.pairs else 1) * a.data.model_max_length)
        if why is not None:
            self.fp8_layers.restore()  # the compiled layers compile again once, in bf16
            self.fp8_layers = None
            self.fast.fp8, self.fast.why["fp8"] = False, why
            if self.env.is_main:
                log.info("--fp8 auto: %s", why)

    def _fp8_pads(self) -> bool:
        """torchao pads the matmuls' inner dimension where a micro-batch's tokens may not be a multiple of 16:
        padded batches (their length rounds to 8), or packed rows whose memory probes are --model_max_length
        long. Packed rows on CUDA round to multiples of 128 tokens (StepLoop._pad_multiple): no padding there."""
        return self.device.type == "cuda" and not (self.fast.packing and self.args.data.model_max_length % 16 == 0)

    def _fp8_watch(self) -> fp8_watch.Fp8Watch:
        a = self.args
        assert self.fp8_layers is not None and self.metrics is not None

        def reference(batch, num_items, num_tokens):
            return self._forward_loss(batch, num_items, num_tokens, train=False)

        return fp8_watch.Fp8Watch(self.fp8_layers, mode=a.fast.fp8, reference=reference, device=self.device,
                                  guard_steps=a.fast.fp8_guard_steps, bound=a.fast.fp8_parity_bound,
                                  start_step=self.start_step, total_steps=self.total_steps, write=self.metrics.write,
                                  is_main=self.env.is_main, method=self.method, compiled=self.fast.compile)

    def trainable_params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _size_rows(self) -> None:
        a = self.args
        apply.size_rows(self.model, self.loss_module, self.fast, self.model_config, self.device, self._autocast,
                        self.wrapped, self.engine,
                        [s for p in self.train_ds.items for s in (p.chosen, p.rejected)] if self.pairs
                        else self.train_ds.items,
                        given=a.fast, train=a.train, max_length=a.data.model_max_length,
                        checkpointing_asked=self.resolved.gradient_checkpointing)

    # ------------------------------------------------------------- the loop
    @property
    def step(self) -> int:
        """The last optimizer step: the loop's while it runs (a stop or a failure names it), else where it began."""
        return self.loop.step if self.loop is not None else self.start_step

    def train(self) -> LoopResult:
        """The step loop (training.step_loop) over what setup() built. --report_to: rank 0's trackers get every
        metrics record from here on (training.runtime.trackers)."""
        a = self.args
        sink = trackers.open_trackers(a, self.resolved, self.env.is_main)
        if sink is not None:
            self.metrics.add_sink(sink)
        self.loop = StepLoop(LoopState(
            train=a.train, save=a.save, data=a.data, eval_strategy=a.hf.eval_strategy, env=self.env, fast=self.fast,
            device=self.device, wrapped=self.wrapped,
            engine=self.engine, ddp=self.ddp, optimizer=self.optimizer, scheduler=self.scheduler, scaler=self.scaler,
            trainable_params=self.trainable_params(), loader=self.loader, pad_id=self.tokenizer.pad_token_id,
            meta_group=self.meta_group, timing_group=self.timing_group, metrics=self.metrics,
            heartbeat=self.heartbeat, timer=self.timer, total_steps=self.total_steps,
            steps_per_epoch=self.steps_per_epoch, start_step=self.start_step,
            aux_loss=self.router is not None and self.router.coef > 0, forward_loss=self._forward_loss,
            evaluate=self.evaluate if self.eval_ds is not None else None, save_checkpoint=self.save_checkpoint,
            pairs=self.pairs, fp8=self.fp8_watch))
        self.trained = self.loop.run()
        return self.trained

    @property
    def wrapped(self):
        """What the forward pass goes through: the DeepSpeed engine, DDP, or the bare model."""
        return next(m for m in (self.engine, self.ddp, self.model) if m is not None)

    @property
    def unwrapped(self):
        return self.model  # the engine (or DDP) wraps it, or model + loss, without copying it

    def _autocast(self):
        a = self.args
        if self.engine is None and (a.train.bf16 or a.train.fp16):
            return torch.autocast(self.device.type, dtype=torch.bfloat16 if a.train.bf16 else torch.float16)
        return contextlib.nullcontext()

    def _forward_loss(self, batch: dict, num_items: torch.Tensor, num_tokens: torch.Tensor | None = None,
                      train: bool = True) -> StepLoss:
        """Summed token cross-entropy / num_items: our loss (training.fast) or HF's own. With num_tokens (the real
        tokens of the optimizer step over all ranks / world size) a mixture-of-experts model adds its routers'
        load-balancing loss weighted by this micro-batch's share of them (training.model.moe); the StepLoss says
        the cross-entropy part and the micro-batch's aux x its real tokens too. DPO: the pairs' summed loss /
        num_items (the step's pairs over all ranks / world size), with the pairs' reward sums."""
        if self.pairs:
            module = (self.engine if self.engine is not None
                      else self.ddp if (train and self.ddp is not None) else self.loss_module)
            with self._autocast():
                loss_sum, sums = module(batch)
            loss = loss_sum / num_items
            return StepLoss(loss, loss, pref_sums=sums.detach() if "loss_seq" in batch else None)
        if self.router is not None and num_tokens is not None and self.router.coef > 0:
            from training.model.moe import real_token_mask

            with self.router.collecting():
                ce = self._forward_ce(batch, num_items, train)
            mask, real = real_token_mask(batch)
            aux = self.router.aux(mask)
            return StepLoss(ce + self.router.coef * aux * (real / num_tokens), ce, aux.detach().double() * real)
        ce = self._forward_ce(batch, num_items, train)
        return StepLoss(ce, ce)

    def _forward_ce(self, batch: dict, num_items: torch.Tensor, train: bool = True) -> torch.Tensor:
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

    # ----------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, step: int) -> float:
        """Token-mean loss on --eval_data_path over all ranks at `step`; logged as an {"event": "eval"} record."""
        a, env = self.args, self.env
        self.heartbeat.phase("eval")
        if self.pairs:
            from training.preference import evaluate_pairs

            return evaluate_pairs(self, step)
        self.wrapped.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for idx in eval_batches(len(self.eval_ds), env.world_size, env.rank, a.train.per_device_eval_batch_size):
            # A rank without records left still runs a forward (ZeRO-3 gathers weights collectively).
            batch = self.collator([self.eval_ds[i] for i in (idx or [0])])
            if not idx:
                batch["labels"].fill_(IGNORE_INDEX)
            batch = {k: v.to(self.device) for k, v in batch.items()}
            loss = self._forward_loss(batch, torch.tensor(1.0, device=self.device), train=False).loss
            total += torch.stack([loss.detach().double(), (batch["labels"] != IGNORE_INDEX).sum().double()])
        total = dist.all_reduce_sum(total)
        self.wrapped.train()
        eval_loss = (total[0] / total[1].clamp(min=1)).item()
        self.metrics.write({"event": "eval", "step": step, "eval_loss": eval_loss, "eval_tokens": int(total[1])})
        log.info("eval at step %d: loss %.4f over %d tokens", step, eval_loss, int(total[1]))
        return eval_loss

    # ------------------------------------------------------------ checkpoints (training.checkpoints.checkpointer)
    def save_checkpoint(self, step: int) -> None:
        a, env = self.args, self.env
        self.heartbeat.phase("checkpoint")
        began = time.monotonic()
        final = self.checkpointer.save_checkpoint(step, {
            "step": step, "epoch": step / self.steps_per_epoch, "total_steps": self.total_steps,
            "global_batch_size": self.global_batch, "world_size": env.world_size, "method": self.method,
            "zero_stage": self.stage, "seed": a.train.seed, "model": a.model.model_name_or_path,
            "lineage": self.lineage, "run_id": os.environ.get("QWEN_TUI_RUN_ID"),  # set in a job qwen-tui started
        }, self.engine, self.optimizer, self.scheduler, self.scaler)
        if env.is_main:
            # how long a save takes here: the monitor tells a slow save from peers waiting for a lost node by it
            self.metrics.write({"event": "checkpoint", "step": step, "path": str(final),
                                "seconds": round(time.monotonic() - began, 3)})

    def save_final(self) -> None:
        self.heartbeat.phase("checkpoint")
        if self.fp8_layers is not None and self.fp8_layers.active:
            self.fp8_layers.restore()  # the saved model (and a merged one) is made of plain nn.Linear layers
        self.checkpointer.save_final()

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
        self.heartbeat.phase("collective")
        sums = self.replica_checksums()
        trained = self.trained
        trunc = ((trained.lazy_truncated if trained else 0) if self.args.data.lazy_preprocess
                 else self.train_ds.stats.truncated)
        self.metrics.write({
            "event": "end", "status": "ok", "step": self.step, "total_steps": self.total_steps,
            "train_runtime": trained.train_runtime if trained else None, "truncated_records": trunc,
            "replica_checksums": sums, "replicas_in_sync": None if sums is None else len(set(sums)) == 1,
            "output_dir": os.path.abspath(self.args.train.output_dir),
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
