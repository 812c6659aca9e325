"""Which fast-path switches are on for this run, and why.

decide()        resolves --packing, --fused_ce, --compile, --fused_adamw, --auto_micro_batch, --lora_input_cast,
                --attention_kernel, --fused_lora_dropout, --labelled_logits_only and --overlap_steps, and reports
                --expandable_segments (set by the entry point) where the user left them to us, and refuses
                combinations that cannot work (each with the reason): one small decider a switch, in the
                table DECIDERS, each returning its choice and why
FastChoice      the switches, each with the reason it is on or off (`why`), as the worker logs and records them
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from training.flags import FastFlags, LoraFlags
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
    experts: str | None = None  # a mixture of experts' kernel (training.model.moe_experts), set when the model loads
    fp8: bool = False  # torchao's FP8 matmuls (training.fast.fp8), set once the model's shape is known
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
                 f"gradient checkpointing {on(self.gradient_checkpointing)}", f"fp8 {on(self.fp8)}"]
        parts += [f"experts {self.experts}"] if self.experts else []
        return "fast path: " + ", ".join(parts) + "; " + "; ".join(f"{k}: {v}" for k, v in self.why.items())


def _varlen_available() -> bool:
    from training.fast.attention import varlen_available

    return varlen_available()


def _cudnn_unfit() -> str | None:
    from training.fast.attention import cudnn_unfit

    return cudnn_unfit()


@dataclass(frozen=True)
class _Run:
    """What every switch's decider reads: the fast path's flags as given, the LoRA flags, and the facts of this
    run (the allocator's expandable segments as the entry point set them)."""
    given: FastFlags
    lora_flags: LoraFlags
    half: bool  # --bf16 or --fp16
    device: torch.device
    deepspeed: bool
    zero_stage: int
    expandable: bool | None
    expandable_why: str | None

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def lora(self) -> bool:
        return bool(self.lora_flags.use_lora or self.lora_flags.q_lora)


# A decider: (the run, the switches decided before it) -> (its choice, why), or InputError for an explicit
# choice that cannot work.
Decider = Callable[[_Run, dict[str, Any]], tuple[Any, str]]


def _packing(r: _Run, _: dict) -> tuple[bool, str]:
    if r.given.packing is not None:
        return bool(r.given.packing), "as given"
    if r.cuda and not _varlen_available():
        return False, "off: this torch has no flash varlen attention for packed rows"
    why = "on: varlen attention of packed rows" if r.cuda else "on: per-record attention on CPU"
    if r.deepspeed:  # the engine is told which row ends the step (Recipe._train_loop), however many there are
        why += f" (ZeRO-{r.zero_stage}: the rows of a step end it, not a micro-batch count)"
    return True, why


def _fused_ce(r: _Run, chosen: dict) -> tuple[str, str]:
    # Under ZeRO-3 the LM head's weight is partitioned: the loss runs inside a module DeepSpeed gathers it for
    # (training.fast.apply.HeadLoss).
    liger_ok = r.cuda and importlib.util.find_spec("liger_kernel") is not None
    given = r.given.fused_ce
    if given == "auto":
        if liger_ok:
            return "liger", "liger: CUDA and liger-kernel installed"
        return "chunked", "chunked: " + ("no liger-kernel installed" if r.cuda else "Liger needs CUDA")
    if given == "off":
        packing = chosen["packing"]
        return ("plain" if packing else "hf"), "off as given" + (" (full logits, summed over the packed row)"
                                                                 if packing else "")
    if given == "liger" and not liger_ok:
        raise InputError("--fused_ce liger needs a CUDA GPU and the liger-kernel package; --fused_ce chunked "
                         "runs anywhere")
    return given, "as given"


def _compile(r: _Run, _: dict) -> tuple[bool, str]:
    # Under ZeRO-3 each layer is one DeepSpeed leaf module, gathered whole, and its forward is compiled inside
    # DeepSpeed's hooks (training.fast.compile).
    if r.given.compile is not None:
        return bool(r.given.compile), "as given"
    from training.fast.compile import compile_available

    comp = compile_available(r.device)
    return comp, "on: CUDA with Triton" if comp else "off: CUDA only by default" if not r.cuda else "off: no Triton"


def _fused_adamw(r: _Run, _: dict) -> tuple[bool, str]:
    # Under DeepSpeed: the client optimizer the engine steps on its flat fp32 partitions.
    if r.given.fused_adamw is not None:
        return bool(r.given.fused_adamw), "as given"
    return r.cuda, "on: CUDA" if r.cuda else "off: CUDA only by default"


def _auto_micro_batch(r: _Run, chosen: dict) -> tuple[bool, str]:
    # The memory probe (under DeepSpeed it runs after the engine has built its optimizer states).
    f, packing = r.given, chosen["packing"]
    if f.auto_micro_batch is None:
        auto = r.cuda and packing and f.packing_tokens is None
        return auto, ("on: CUDA with packing" + (" (measured after the engine is built)" if r.deepspeed else "")
                      if auto else "off: --packing_tokens given" if f.packing_tokens is not None
                      else "off: needs CUDA and packing")
    auto = bool(f.auto_micro_batch)
    if auto and not (r.cuda and packing):
        raise InputError("--auto_micro_batch measures CUDA memory for packed rows: it needs a CUDA GPU and packing")
    if auto and f.packing_tokens is not None:
        raise InputError("--auto_micro_batch picks the packed-row size itself; drop --packing_tokens or it")
    return auto, "as given"


def _lora_input_cast(r: _Run, _: dict) -> tuple[bool, str]:
    # peft's cast of adapter inputs to fp32 (the adapters' dtype).
    if r.given.lora_input_cast is not None:
        return bool(r.given.lora_input_cast), "as given"
    cast = not (r.lora and r.cuda and r.half and not r.deepspeed)
    if not r.lora:
        return cast, "n/a: no adapters"
    if not cast:
        return cast, "off: CUDA autocast casts adapter inputs to half precision for the matmul anyway"
    if r.deepspeed:
        return cast, "on: DeepSpeed runs the adapters in the model dtype"
    if not r.half:
        return cast, "on: no autocast without --bf16/--fp16"
    return cast, "on: CPU dropout on bf16 scales in bf16 (not the same values)"


def _attention_kernel(r: _Run, chosen: dict) -> tuple[str, str]:
    # The varlen kernel of packed rows.
    given, packing = r.given.attention_kernel, chosen["packing"]
    if given == "auto":
        # cuDNN where it can run with its backward plans bounded (one plan per record count): a 7B LoRA step runs
        # 3% faster than with FlashAttention 2, attention taking two thirds of its device time (bench/README.md's
        # train_speed and attention_kernels results).
        if not (packing and r.cuda):
            return "flash", "n/a: no packed rows on CUDA"
        unfit = _cudnn_unfit()
        if unfit:
            return "flash", f"flash: {unfit}"
        return "cudnn", "cudnn: Hopper GPU and nvidia-cudnn-frontend (faster than FlashAttention 2)"
    if given == "cudnn":
        from training.fast.attention import cudnn_available

        if not cudnn_available():
            raise InputError("--attention_kernel cudnn needs a CUDA GPU of compute capability 9.0 or newer and the "
                             "nvidia-cudnn-frontend package (pip install nvidia-cudnn-frontend)")
        if not packing:
            raise InputError("--attention_kernel cudnn is the attention of packed rows; it needs packing "
                             "(drop --no_packing or --deepspeed)")
    return given, "as given"


def _fused_lora_dropout(r: _Run, _: dict) -> tuple[bool, str]:
    # LoRA dropout inside the adapter's first matmul.
    if r.given.fused_lora_dropout is None:
        # Opt-in: on the 7B shape it runs at the same speed as peft's dropout (bench/lora_dropout_kernel.py),
        # with 27% less activation memory a token (longer rows, or no checkpointing, where memory is short).
        drop = float(r.lora_flags.lora_dropout or 0.0)
        return False, ("n/a: no adapters" if not r.lora else "n/a: --lora_dropout 0" if drop <= 0
                       else "off: opt-in (saves activation memory; measured no faster)")
    fused_drop = bool(r.given.fused_lora_dropout)
    if fused_drop:
        if not r.lora:
            raise InputError("--fused_lora_dropout fuses LoRA's dropout: it needs --use_lora or --q_lora")
        # Imported only when asked for: the module imports Triton, a second of every start-up otherwise.
        from training.fast.lora_dropout import available as fused_dropout_available

        if not fused_dropout_available(r.device):
            raise InputError("--fused_lora_dropout runs a Triton kernel: it needs a CUDA GPU and the triton "
                             "package")
        if r.deepspeed:
            raise InputError("--fused_lora_dropout is not supported under --deepspeed; drop one of them")
    return fused_drop, "as given"


def _labelled_logits_only(r: _Run, chosen: dict) -> tuple[bool, str]:
    # The LM head on supervised positions only.
    packing, ce = chosen["packing"], chosen["ce"]
    if r.given.labelled_logits_only is None:
        labelled = packing and ce in ("liger", "chunked")
        return labelled, ("on: packed rows with a fused loss (no logits for prompt tokens)" if labelled
                          else "off: needs packing" if not packing
                          else f"off: loss {ce} (the reference path keeps every logit)")
    labelled = bool(r.given.labelled_logits_only)
    if labelled and not packing:
        raise InputError("--labelled_logits_only selects a packed row's supervised positions: it needs packing "
                         "(drop --no_packing or --deepspeed)")
    return labelled, "as given"


def _overlap_steps(r: _Run, _: dict) -> tuple[bool, str]:
    # Reading the loss back a step late.
    if r.given.overlap_steps is not None:
        return bool(r.given.overlap_steps), "as given"
    return r.cuda, ("on: CUDA (the GPU is not left idle while the host logs and starts the next step)" if r.cuda
                    else "off: on CPU every operation waits anyway")


def _expandable_segments(r: _Run, _: dict) -> tuple[bool, str]:
    # The allocator: the entry point (training.finetune) sets it before torch starts CUDA; this only reports it.
    expandable = bool(r.expandable) and r.cuda
    if not r.cuda:
        return expandable, "n/a: CUDA only"
    return expandable, r.expandable_why or ("on" if expandable else "off: not set before CUDA started")


# (FastChoice's field, its key in `why`: the flag's name, decider), in the order they are decided and reported;
# a decider may read the fields decided above it.
DECIDERS: tuple[tuple[str, str, Decider], ...] = (
    ("packing", "packing", _packing),
    ("ce", "fused_ce", _fused_ce),
    ("compile", "compile", _compile),
    ("fused_adamw", "fused_adamw", _fused_adamw),
    ("auto_micro_batch", "auto_micro_batch", _auto_micro_batch),
    ("lora_input_cast", "lora_input_cast", _lora_input_cast),
    ("attention", "attention_kernel", _attention_kernel),
    ("fused_lora_dropout", "fused_lora_dropout", _fused_lora_dropout),
    ("labelled_logits", "labelled_logits_only", _labelled_logits_only),
    ("overlap_steps", "overlap_steps", _overlap_steps),
    ("expandable_segments", "expandable_segments", _expandable_segments),
)


def decide(given: FastFlags, lora: LoraFlags, *, half: bool, device: torch.device, deepspeed: bool,
           zero_stage: int = 2, expandable: bool | None = None, expandable_why: str | None = None) -> FastChoice:
    """The fast-path switches for this run from their flags as given (`given`); raises InputError for an explicit
    choice that cannot work. half: --bf16 or --fp16; zero_stage: DeepSpeed's ZeRO stage when `deepspeed` (said in
    the reasons); expandable: the allocator's expandable segments as the entry point set them, and why."""
    run = _Run(given, lora, half, device, deepspeed, zero_stage, expandable, expandable_why)
    chosen: dict[str, Any] = {}
    why: dict[str, str] = {}
    for name, key, decider in DECIDERS:
        chosen[name], why[key] = decider(run, chosen)
    return FastChoice(**chosen, why=why)
