"""Which fast-path switches are on for this run, and why.

decide()        resolves --packing, --fused_ce, --compile, --fused_adamw, --auto_micro_batch, --lora_input_cast,
                --attention_kernel, --fused_lora_dropout, --labelled_logits_only and --overlap_steps, and reports
                --expandable_segments (set by the entry point) where the user left them to us, and refuses
                combinations that cannot work (each with the reason)
FastChoice      the switches, each with the reason it is on or off (`why`), as the worker logs and records them
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import asdict, dataclass, field

import torch

from training.runtime.errors import InputError

log = logging.getLogger("training")

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
