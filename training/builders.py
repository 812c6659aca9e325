"""The recipe's components, each built from its slice of the flags: the model, the optimizer (with the DeepSpeed
engine or DDP around the model), and the data loader. Each builder returns what it built; the recipe wires them
together in the order its setup() explains.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.data.batches import Collator, StepSampler
from training.fast import apply
from training.flags import LoraFlags, MoeFlags, TrainFlags
from training.model import moe_experts
from training.model.pretrained import apply_method, load_model
from training.runtime import dist, unused_imports

log = logging.getLogger("training")


@dataclass
class Optimization:
    """What steps the weights: the optimizer and its schedule, and what wraps the model for the forward."""
    optimizer: Any
    scheduler: Any
    engine: Any = None  # the DeepSpeed engine (wraps model + loss, or the model)
    ddp: Any = None  # DistributedDataParallel (several processes without DeepSpeed)
    scaler: Any = None  # fp16's gradient scaler without DeepSpeed


@dataclass
class Loading:
    collator: Collator
    sampler: StepSampler
    loader: torch.utils.data.DataLoader


def build_model(source: str, method: str, device, load_dtype, quant: str | None, stage: int, fast,
                resume_dir: Path | None, ds_config: dict | None, *, train: TrainFlags, lora: LoraFlags,
                moe: MoeFlags, random_init: bool, checkpointed: bool):
    """The model as the method trains it, on its device (under ZeRO-3 partitioned while it loads, or by the engine).
    checkpointed: gradient checkpointing as set-up resolved it. Returns (model, transformers' ZeRO-3 config object,
    which must stay alive while the model loads)."""
    hf_ds_config = None
    if stage == 3 and method != "qlora":
        from transformers.integrations import HfDeepSpeedConfig

        # Tells from_pretrained to partition the weights across ranks as it loads them. transformers never does
        # that for a quantized model (and refuses a device_map then): a 4-bit base is quantized in host memory
        # and partitioned by deepspeed.initialize (training.model.pretrained.load_model).
        hf_ds_config = HfDeepSpeedConfig(ds_config)
    if resume_dir and method == "full" and not train.deepspeed:
        source = str(resume_dir)  # the checkpoint holds the full model in HF format
    model = load_model(source, method, device, load_dtype, quant, stage, train=train, random_init=random_init)
    experts = moe_experts.apply(model, moe.experts_implementation, torch.device(device))
    if experts:  # said beside the fast path's other switches
        fast.experts, fast.why["experts"] = experts
    model = apply_method(model, method, lora, train_router=moe.train_router, checkpointed=checkpointed)
    if method != "full" and not fast.lora_input_cast:
        apply.set_lora_input_cast(model, False)
    if fast.fused_lora_dropout:
        from training.fast.lora_dropout import fuse_lora_dropout

        log.info("LoRA dropout fused into lora_A in %d adapted projections", fuse_lora_dropout(model))
    if resume_dir and method != "full" and not train.deepspeed:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(model, load_file(str(resume_dir / "adapter_model.safetensors")))
    if stage == 3 and method != "qlora" and (train.bf16 or train.fp16):
        dtype = torch.bfloat16 if train.bf16 else torch.float16
        n = cast_unpartitioned(model, dtype)
        if n:
            log.info("ZeRO-3: %d parameters added after loading (the adapters) cast to %s, as the engine casts them "
                     "under ZeRO-1/2", n, str(dtype).removeprefix("torch."))
    if stage == 3 and method != "full":
        # The frozen embedding's output needs no gradient, so the first layer's inputs need none: DeepSpeed's
        # backward hook on that layer then fires as its backward starts and releases the weights it is about to
        # use (a size-0 weight in the backward, seen on an H200). With input gradients it fires after.
        model.enable_input_require_grads()
    if method != "qlora" and stage != 3:
        model.to(device)
    return model, hf_ds_config


def cast_unpartitioned(model, dtype) -> int:
    """ZeRO-3 with a base partitioned while it loaded: the engine casts no parameter to the config's 16-bit dtype
    then (it takes the model as zero.Init made it), so the LoRA adapters added after loading would train in fp32,
    and peft casts every adapter input to them. On an H200 that left 7B LoRA at 0.65x plain DDP, with fp32 dropout
    copies saved for the backward (8.5 MiB a token against 6.1). Casts the floating parameters ZeRO-3 has not
    partitioned yet to `dtype`, as the engine does under ZeRO-1/2 (its optimizer keeps fp32 masters either way);
    returns how many."""
    n = 0
    for p in model.parameters():
        if not hasattr(p, "ds_id") and p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
            n += 1
    return n


def build_optimization(train: TrainFlags, warmup_steps: int, env, model, loss_module, fast, ds_config: dict | None,
                       device, total_steps: int) -> Optimization:
    """AdamW (no weight decay on biases and norms) with the scheduler, inside the DeepSpeed engine under
    --deepspeed, else with DDP around the model (or model + loss) on several processes. Sets fast.fused_adamw to
    what was used. warmup_steps: HF's --warmup_steps (0: --warmup_ratio's)."""
    from transformers import get_scheduler

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def is_matrix(p) -> bool:
        return len(getattr(p, "ds_shape", p.shape)) >= 2  # ZeRO-3 shards are flat; ds_shape is the real one

    # No weight decay on biases and norm weights (1-D), as in HF Trainer.
    groups = [
        {"params": [p for n, p in named if is_matrix(p)], "weight_decay": train.weight_decay},
        {"params": [p for n, p in named if not is_matrix(p)], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    # HF: --warmup_steps (a count of optimizer steps) overrides --warmup_ratio
    warmup = warmup_steps if warmup_steps > 0 else math.ceil(train.warmup_ratio * total_steps)

    def make_scheduler(optimizer):
        return get_scheduler(train.lr_scheduler_type, optimizer, num_warmup_steps=warmup,
                             num_training_steps=total_steps)

    def adamw(fused: bool):
        t = train
        return torch.optim.AdamW(groups, lr=t.learning_rate, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_epsilon,
                                 fused=fused or None)

    if train.deepspeed:
        import deepspeed

        optimizer = None
        if "optimizer" not in ds_config:
            # The client optimizer: DeepSpeed steps it on its flat fp32 partitions, so fused AdamW is one kernel
            # over each partition. On CUDA by default; on CPU as given (torch has a CPU kernel too).
            optimizer = adamw(fast.fused_adamw)
        else:
            fast.fused_adamw = False
            fast.why["fused_adamw"] = "off: the DeepSpeed config names its own optimizer"
        unused_imports.load_deepspeed_muon_uncompiled(optimizer)
        # With our loss the engine wraps model + loss, so its forward (and ZeRO-3's gathering) is what runs.
        engine, optimizer, _, scheduler = deepspeed.initialize(
            model=loss_module if loss_module is not None else model, optimizer=optimizer,
            model_parameters=groups if optimizer is None else None, lr_scheduler=make_scheduler, config=ds_config,
        )
        return Optimization(optimizer, scheduler, engine=engine)
    from training.fast.optim import fused_supported

    fused = fast.fused_adamw and fused_supported(p for _, p in named)
    if fast.fused_adamw and not fused:
        log.warning("fused AdamW is not supported for these parameters; using the default AdamW")
    fast.fused_adamw = fused
    optimizer = adamw(fused)
    opt = Optimization(optimizer, make_scheduler(optimizer))
    if train.fp16:
        opt.scaler = torch.amp.GradScaler("cuda")
    if env.world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        # With our loss, DDP wraps model + loss, so the forward that DDP sees is the one that runs.
        # No broadcast of buffers before each step's first forward: a Qwen model's only buffers are the rotary
        # frequencies, which every rank computes alike; the broadcast was one more wait for all ranks each step,
        # hidden inside the forward (training.runtime.step_timing would count it as compute). Experts kept as one module
        # each (transformers 4) get no gradient on a rank whose tokens none chose.
        from training.model.moe import expert_layout

        opt.ddp = DistributedDataParallel(loss_module if loss_module is not None else model,
                                          device_ids=[device.index] if device.type == "cuda" else None,
                                          find_unused_parameters=expert_layout(model) == "modules",
                                          **no_per_step_buffer_sync(DistributedDataParallel))
    return opt


def no_per_step_buffer_sync(ddp_class) -> dict:
    """DDP's keyword for "no buffer broadcast before each forward". Newer torch names it forward_sync_buffers and
    warns on broadcast_buffers; its one sync at init is harmless here (every rank's rotary buffers are alike)."""
    import inspect

    if "forward_sync_buffers" in inspect.signature(ddp_class.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def place_shards(model, method: str, device, is_main: bool) -> dict:
    """ZeRO-3, after deepspeed.initialize: a 4-bit base's quantization constants follow its shards to the GPU.
    Returns how much of the frozen base each rank holds (about 1/world each), for the start record."""
    from training.model.pretrained import shard_quantized_base

    if method == "qlora":
        shard_quantized_base(model, device)
    frozen = [p for p in model.parameters() if not p.requires_grad and hasattr(p, "ds_tensor")]
    held = sum(p.ds_tensor.numel() for p in frozen)
    total = sum(p.ds_numel for p in frozen)
    by_rank = [int(x) for x in dist.all_gather_floats(float(held), device)]
    if total and is_main:
        log.info("ZeRO-3: the frozen base's %d stored elements held as %s by rank (%s)", total, by_rank,
                 ", ".join(f"{100 * h / total:.1f}%" for h in by_rank))
    return {"held_by_rank": by_rank, "total": total}


def build_loader(train: TrainFlags, num_workers: int, env, dataset, pad_id: int, device, packing: bool,
                 total_steps: int, start_step: int) -> Loading:
    """The step sampler (every rank's share of each optimizer step, resumable at start_step) and its loader:
    padded batches, or (packing) the records themselves, packed a whole step at a time by the loop."""
    collator = Collator(pad_id, pad_to_multiple_of=8 if device.type == "cuda" else 1)
    sampler = StepSampler(len(dataset), env.world_size, env.rank, train.per_device_train_batch_size,
                          train.gradient_accumulation_steps, train.seed, total_steps, start_step=start_step)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=_records_of if packing else collator,
        num_workers=num_workers, pin_memory=device.type == "cuda",
        # Its own generator: a loader seeds its workers from the global RNG otherwise, and a
        # resumed run would then draw different dropout masks than an uninterrupted one.
        generator=torch.Generator().manual_seed(train.seed),
    )
    return Loading(collator, sampler, loader)


def _records_of(items: list) -> list:
    """collate_fn of packed training: the records themselves (the loop packs a whole step at once)."""
    return list(items)
