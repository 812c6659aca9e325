"""The worker's side of the fast path (training.fast): which switches are on, and the pieces the loop needs.

decide()        resolves --packing, --fused_ce, --compile, --fused_adamw, --auto_micro_batch, --lora_input_cast,
                --attention_kernel, --fused_lora_dropout, --labelled_logits_only and --overlap_steps, and reports
                --expandable_segments (set by the entry point) where the user left them to us, and refuses
                combinations that cannot work (each with the reason)
FastLoss        the module DDP or DeepSpeed wraps when the loss is ours: one micro-batch (packed row or padded
                batch) -> (summed token loss, labelled tokens); the decoder runs without building the full logits,
                and the head and loss run in HeadLoss (under ZeRO-3 the module DeepSpeed gathers the head for)
pack_step()     one optimizer step's records of this rank -> packed rows, padded with empty rows to `rows`
probe_tokens()  the packed-row budget from two CUDA memory probes (training.fast.autobatch)
set_lora_input_cast()
                peft's cast of adapter inputs to the adapters' fp32, on or off (--lora_input_cast)

The loss normalisation is the recipe's, unchanged: every micro-batch's summed loss is divided by the
supervised tokens of the whole optimizer step over all ranks.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import asdict, dataclass, field

import torch

from training.errors import InputError

log = logging.getLogger("training")

IGNORE_INDEX = -100


@dataclass
class FastChoice:
    packing: bool
    ce: str  # "liger", "chunked", "plain" (full logits, our loss: packing without a fused loss) or "hf" (transformers' loss)
    compile: bool
    fused_adamw: bool
    auto_micro_batch: bool
    lora_input_cast: bool = True  # peft's cast of adapter inputs to the adapter dtype (LoRA/Q-LoRA only)
    attention: str = "flash"  # the varlen kernel of packed rows on CUDA: "flash" or "cudnn"
    overlap_steps: bool = False  # queue step N+1 before reading step N's loss back
    fused_lora_dropout: bool = False  # LoRA dropout inside lora_A's Triton kernel (training.fast.lora_dropout)
    expandable_segments: bool = False  # the CUDA allocator's expandable segments (set before CUDA starts)
    labelled_logits: bool = False  # the LM head on packed rows' supervised positions only
    packing_tokens: int | None = None  # set by the recipe (flag, probe or default)
    gradient_checkpointing: bool = False
    experts: str | None = None  # a mixture of experts' kernel (training.moe_experts), set when the model loads
    why: dict[str, str] = field(default_factory=dict)

    @property
    def our_loss(self) -> bool:
        return self.ce != "hf"

    def record(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        def on(x, name=None):
            return "n/a" if name and self.why.get(name, "").startswith("n/a") else "on" if x else "off"

        parts = [f"packing {on(self.packing)}" + (f" ({self.packing_tokens} tokens a row)" if self.packing else ""),
                 f"loss {self.ce}", f"compile {on(self.compile)}", f"fused AdamW {on(self.fused_adamw)}",
                 f"auto micro-batch {on(self.auto_micro_batch)}",
                 f"LoRA input cast {on(self.lora_input_cast, 'lora_input_cast')}", f"attention {self.attention}",
                 f"fused LoRA dropout {on(self.fused_lora_dropout, 'fused_lora_dropout')}",
                 f"labelled logits only {on(self.labelled_logits)}",
                 f"overlapped steps {on(self.overlap_steps)}",
                 f"expandable segments {on(self.expandable_segments)}",
                 f"gradient checkpointing {on(self.gradient_checkpointing)}"]
        parts += [f"experts {self.experts}"] if self.experts else []
        return "fast path: " + ", ".join(parts) + "; " + "; ".join(f"{k}: {v}" for k, v in self.why.items())


def _varlen_available() -> bool:
    from training.fast.attention import varlen_available

    return varlen_available()


def _cudnn_unfit() -> str | None:
    from training.fast.attention import cudnn_unfit

    return cudnn_unfit()


def decide(args, device: torch.device, deepspeed: bool, zero_stage: int = 2) -> FastChoice:
    """The fast-path switches for this run; raises InputError for an explicit choice that cannot work.
    zero_stage: DeepSpeed's ZeRO stage when `deepspeed` (said in the reasons)."""
    cuda = device.type == "cuda"
    why = {}
    # Packing.
    if args.packing is None:
        if cuda and not _varlen_available():
            packing, why["packing"] = False, "off: this torch has no flash varlen attention for packed rows"
        else:
            packing = True
            why["packing"] = "on: varlen attention of packed rows" if cuda else "on: per-record attention on CPU"
            if deepspeed:  # the engine is told which row ends the step (Recipe._train_loop), however many there are
                why["packing"] += f" (ZeRO-{zero_stage}: the rows of a step end it, not a micro-batch count)"
    else:
        packing, why["packing"] = bool(args.packing), "as given"
    # Cross-entropy. Under ZeRO-3 the LM head's weight is partitioned: the loss runs inside a module DeepSpeed
    # gathers it for (training.fast.sharded).
    liger_ok = cuda and importlib.util.find_spec("liger_kernel") is not None
    if args.fused_ce == "auto":
        if liger_ok:
            ce, why["fused_ce"] = "liger", "liger: CUDA and liger-kernel installed"
        else:
            ce = "chunked"
            why["fused_ce"] = "chunked: " + ("no liger-kernel installed" if cuda else "Liger needs CUDA")
    elif args.fused_ce == "off":
        ce = "plain" if packing else "hf"
        why["fused_ce"] = "off as given" + (" (full logits, summed over the packed row)" if packing else "")
    else:
        if args.fused_ce == "liger" and not liger_ok:
            raise InputError("--fused_ce liger needs a CUDA GPU and the liger-kernel package; --fused_ce chunked "
                             "runs anywhere")
        ce, why["fused_ce"] = args.fused_ce, "as given"
    # torch.compile of the decoder layers (under ZeRO-3 each layer is one DeepSpeed leaf module, gathered whole,
    # and its forward is compiled inside DeepSpeed's hooks: training.fast.compile).
    if args.compile is None:
        from training.fast.compile import compile_available

        comp = compile_available(device)
        why["compile"] = "on: CUDA with Triton" if comp else "off: CUDA only by default" if not cuda else "off: no Triton"
    else:
        comp, why["compile"] = bool(args.compile), "as given"
    # Fused AdamW (under DeepSpeed: the client optimizer the engine steps on its flat fp32 partitions).
    if args.fused_adamw is None:
        fused = cuda
        why["fused_adamw"] = "on: CUDA" if fused else "off: CUDA only by default"
    else:
        fused, why["fused_adamw"] = bool(args.fused_adamw), "as given"
    # The memory probe (under DeepSpeed it runs after the engine has built its optimizer states).
    if args.auto_micro_batch is None:
        auto = cuda and packing and args.packing_tokens is None
        why["auto_micro_batch"] = ("on: CUDA with packing" + (" (measured after the engine is built)" if deepspeed
                                                              else "") if auto
                                   else "off: --packing_tokens given" if args.packing_tokens is not None
                                   else "off: needs CUDA and packing")
    else:
        auto = bool(args.auto_micro_batch)
        if auto and not (cuda and packing):
            raise InputError("--auto_micro_batch measures CUDA memory for packed rows: it needs a CUDA GPU and packing")
        if auto and args.packing_tokens is not None:
            raise InputError("--auto_micro_batch picks the packed-row size itself; drop --packing_tokens or it")
        why["auto_micro_batch"] = "as given"
    # peft's cast of adapter inputs to fp32 (the adapters' dtype).
    lora = bool(getattr(args, "use_lora", False) or getattr(args, "q_lora", False))
    half = bool(args.bf16 or getattr(args, "fp16", False))
    if args.lora_input_cast is None:
        cast = not (lora and cuda and half and not deepspeed)
        if not lora:
            why["lora_input_cast"] = "n/a: no adapters"
        elif not cast:
            why["lora_input_cast"] = "off: CUDA autocast casts adapter inputs to half precision for the matmul anyway"
        elif deepspeed:
            why["lora_input_cast"] = "on: DeepSpeed runs the adapters in the model dtype"
        elif not half:
            why["lora_input_cast"] = "on: no autocast without --bf16/--fp16"
        else:
            why["lora_input_cast"] = "on: CPU dropout on bf16 scales in bf16 (not the same values)"
    else:
        cast, why["lora_input_cast"] = bool(args.lora_input_cast), "as given"
    # The varlen kernel of packed rows.
    choice = getattr(args, "attention_kernel", "auto")
    if choice == "auto":
        # cuDNN where it can run with its backward plans bounded: with one plan per record count a 7B LoRA step
        # ran 3.0% faster than with FlashAttention 2, and attention took 111 ms of device time against 168 ms
        # (bench/results run18). Before that bound, plans were built per row width and it measured no faster.
        unfit = _cudnn_unfit() if packing and cuda else "no packed rows on CUDA"
        attention = "flash" if unfit else "cudnn"
        why["attention_kernel"] = ("n/a: no packed rows on CUDA" if not (packing and cuda)
                                   else f"flash: {unfit}" if unfit
                                   else "cudnn: Hopper GPU and nvidia-cudnn-frontend (faster than FlashAttention 2)")
    else:
        if choice == "cudnn":
            from training.fast.attention import cudnn_available

            if not cudnn_available():
                raise InputError("--attention_kernel cudnn needs a CUDA GPU of compute capability 9.0 or newer and the "
                                 "nvidia-cudnn-frontend package (pip install nvidia-cudnn-frontend)")
            if not packing:
                raise InputError("--attention_kernel cudnn is the attention of packed rows; it needs packing "
                                 "(drop --no_packing or --deepspeed)")
        attention, why["attention_kernel"] = choice, "as given"
    # LoRA dropout inside the adapter's first matmul.
    drop = float(getattr(args, "lora_dropout", 0.0) or 0.0)
    if getattr(args, "fused_lora_dropout", None) is None:
        # Opt-in: on the 7B shape it measured the same speed as peft's dropout (bench/results runs 15 and 16),
        # with 27% less activation memory a token (longer rows, or no checkpointing, where memory is short).
        fused_drop = False
        why["fused_lora_dropout"] = ("n/a: no adapters" if not lora else "n/a: --lora_dropout 0" if drop <= 0
                                     else "off: opt-in (saves activation memory; measured no faster)")
    else:
        fused_drop = bool(args.fused_lora_dropout)
        if fused_drop:
            if not lora:
                raise InputError("--fused_lora_dropout fuses LoRA's dropout: it needs --use_lora or --q_lora")
            # Imported only when asked for: the module imports Triton, a second of every start-up otherwise.
            from training.fast.lora_dropout import available as fused_dropout_available

            if not fused_dropout_available(device):
                raise InputError("--fused_lora_dropout runs a Triton kernel: it needs a CUDA GPU and the triton "
                                 "package")
            if deepspeed:
                raise InputError("--fused_lora_dropout is not supported under --deepspeed; drop one of them")
        why["fused_lora_dropout"] = "as given"
    # The LM head on supervised positions only.
    if getattr(args, "labelled_logits_only", None) is None:
        labelled = packing and ce in ("liger", "chunked")
        why["labelled_logits_only"] = (
            "on: packed rows with a fused loss (no logits for prompt tokens)" if labelled
            else "off: needs packing" if not packing else f"off: loss {ce} (the reference path keeps every logit)")
    else:
        labelled = bool(args.labelled_logits_only)
        if labelled and not packing:
            raise InputError("--labelled_logits_only selects a packed row's supervised positions: it needs packing "
                             "(drop --no_packing or --deepspeed)")
        why["labelled_logits_only"] = "as given"
    # Reading the loss back a step late.
    if args.overlap_steps is None:
        overlap = cuda
        why["overlap_steps"] = ("on: CUDA (the GPU is not left idle while the host logs and starts the next step)"
                                if cuda else "off: on CPU every operation waits anyway")
    else:
        overlap, why["overlap_steps"] = bool(args.overlap_steps), "as given"
    # The allocator: the entry point (training.finetune) sets it before torch starts CUDA.
    expandable = bool(getattr(args, "expandable_segments", False)) and cuda
    if not cuda:
        why["expandable_segments"] = "n/a: CUDA only"
    else:
        why["expandable_segments"] = getattr(args, "expandable_why", None) or (
            "on" if expandable else "off: not set before CUDA started")
    return FastChoice(packing=packing, ce=ce, compile=comp, fused_adamw=fused, auto_micro_batch=auto,
                      lora_input_cast=cast, attention=attention, fused_lora_dropout=fused_drop, overlap_steps=overlap,
                      expandable_segments=expandable, labelled_logits=labelled, why=why)


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

    def shard_head_weight(self) -> None:
        """ZeRO-3: the LM head's weight (the embedding's too, when tied) is gathered for head_loss, whose forward
        uses it outside the head module's own forward."""
        import deepspeed

        deepspeed.zero.register_external_parameter(self.head_loss, self.head_loss._head.weight)


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
    """Two forward+backward probes of packed rows of full-length records; returns training.fast.autobatch.Plan.
    engine: the DeepSpeed engine that wraps loss_module. Its optimizer states and gradient buffers exist already,
    so the probes measure them; they run through the engine, as training does, with the loss times zero: the
    gradients they add to the first step's accumulation are zeros (ZeRO-2/3 reduce every micro-batch, so
    gradients cannot simply be dropped), with the same memory and kernels as a real micro-batch."""
    from training.fast import autobatch
    from training.fast.packing import pack
    from training.fast.step import to_device

    class _Rec:
        def __init__(self, i: int):
            self.input_ids = [(i * 7919 + j) % max(vocab - 1, 1) for j in range(max_segment)]
            self.labels = list(self.input_ids)

    def run(tokens: int):
        from training.sequence_parallel import local

        row = to_device(local(pack([_Rec(i) for i in range(tokens // max_segment)], tokens, 0,
                                   max_segment=max_segment)), device)
        if engine is not None:
            engine.set_gradient_accumulation_boundary(False)
            s, _ = engine(row)
            engine.backward(s * 0.0, scale_wrt_gas=False)
            return
        with autocast():
            s, n = loss_module(row)
        (s / n.clamp(min=1)).backward()
        loss_module.zero_grad(set_to_none=True)

    # The probes draw dropout masks; the run's random numbers start where they would without them.
    with torch.random.fork_rng(devices=[device]):
        return autobatch.probe_plan(loss_module.model, run, device, max_segment, fraction=fraction,
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
