"""FP8 matmuls through torchao's float8 training (--fp8): tensorwise scaling with dynamic casts, on the decoder's
linear layers, inside the compiled layers.

decide()        --fp8 auto|on|off for this run: (on, why); an explicit `on` that cannot run here is an InputError
                (no GPU of compute capability 8.9+, no torchao, Q-LoRA, no --bf16), and `auto` is on only for a
                method and hidden size measured faster through the worker (AUTO_ON_FROM), without DeepSpeed,
                saying why it stays off elsewhere: LoRA's frozen base from the 7B shape on (1.10-1.12x in rows of
                8,192 tokens, MEASURED; 1.17x with gradient checkpointing, MEASURED_CKPT); full fine-tuning and
                DeepSpeed runs measured no faster
short_rows()    auto's second look, once the memory probe has sized the rows: FP8 back off where a GPU's
                micro-batch holds fewer than AUTO_MIN_ROW tokens (the same 7B LoRA ran 0.94x in rows of 4,096)
select()        which linears convert: every nn.Linear inside the decoder layers but a mixture of experts'
                routers; under LoRA the frozen ones only (peft's base_layer of each adapted projection, and any
                projection left without an adapter), never lora_A / lora_B; the embedding and the LM head are
                outside the layers and stay bf16. A layer whose in or out features are not multiples of 16 (what
                FP8 matmuls need) is skipped, by name
convert()       the selected linears swapped for torchao's Float8Linear, which keeps the same Parameter objects:
                the optimizer, ZeRO-3's partitions and the state dict's names are those of the bf16 model
Fp8Layers       the converted modules, with bf16_matmuls() (a context in which they run nn.Linear's bf16 matmul
                and every compiled function runs eagerly: the loss guard's reference) and restore() (back to
                nn.Linear for good: the guard's fallback, and before the final save, so the saved model is a
                plain one)

Under DeepSpeed ZeRO-3 the matmuls run in FP8 and the all-gather of the weights stays bf16: torchao's FP8
all-gather is FSDP2's (its weight wrapper tensor), which DeepSpeed does not use.

TRAINING_FP8_ON_CPU=1 lets --fp8 on run on the CPU (torch's CPU _scaled_mm): the tests' way to run the real
conversion, the guard and the profile count without a GPU; it never speeds anything up, and `auto` ignores it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from dataclasses import dataclass, field

import torch

from training.fast.compile import decoder_of
from training.runtime.errors import InputError

log = logging.getLogger("training")

# FP8 against bf16 through the worker itself (bench/fp8_worker.py: its fast path, compiled layers, tensorwise
# scaling), on one H100. In the rows its memory probe sizes (as a user's run gets them): 7B LoRA on a frozen FP8
# base ran 1.102x and 1.124x of bf16's tokens/s in two calls (rows of 8,192-8,320 tokens, MEASURED and -rows-again),
# the same under DeepSpeed ZeRO-2 1.034x (-rows-zero2), 1.5B full fine-tuning 0.980x and the 7B layer shape in full
# under ZeRO-3 1.047x (-rows-full), the loss within 0.7% of bf16's over 50 steps in all but 1.5B full (5.2% apart at
# step 23). In rows of 4,096 tokens the same 7B LoRA ran 0.941x (fp8_worker-2026-12-05-H100.md): the FP8 step's
# host side then outlasts its GPU work. On one H200, with gradient checkpointing (whose recomputed forward runs its
# matmuls in FP8 too), the same 7B LoRA ran 1.211x and 1.208x in two calls (rows of 16,384 tokens, -H200-ckpt and
# -probe-ckpt), 1.156x without it (-H200-rows); the 7B layer shape in full under ZeRO-3 with checkpointing 1.082x.
# On one H100 the checkpointed 7B LoRA ran 1.171x (MEASURED_CKPT).
# So auto turns FP8 on for LoRA's frozen base from the 7B hidden size on (AUTO_ON_FROM: method -> smallest hidden
# size measured faster), with or without checkpointing, without DeepSpeed, where a GPU's micro-batch holds
# AUTO_MIN_ROW tokens or more; everything else stays bf16 unless --fp8 on.
AUTO_ON_FROM: dict[str, int] = {"lora": 3584}
AUTO_MIN_ROW = 8192
RESULTS = "bench/results/fp8_worker-2026-12-05-H100"
MEASURED = f"{RESULTS}-rows.md"
MEASURED_CKPT = "bench/results/fp8_worker-2026-12-06-H100-ckpt.md"
MEASURED_ON = (f"7B LoRA ran 1.10-1.12x of bf16 through the worker in rows of 8,192 tokens on an H100 ({MEASURED}, "
               f"and -rows-again), 1.17x with gradient checkpointing in rows of 16,384 ({MEASURED_CKPT}; 1.21x on "
               "an H200)")
NOT_FASTER = {"full": f"full fine-tuning measured no faster through the worker (1.5B 0.98x, 7B under ZeRO-3 1.05x: "
                      f"{RESULTS}-rows-full.md)",
              "deepspeed": f"under DeepSpeed FP8 measured within noise of bf16 (7B LoRA under ZeRO-2 1.03x: "
                           f"{RESULTS}-rows-zero2.md; 7B full under ZeRO-3 1.05x)"}
MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.x)
ALIGN = 16  # torch._scaled_mm wants both dimensions of the weight divisible by 16
ROUTERS = ("gate", "shared_expert_gate")  # a mixture of experts' routing layers stay bf16: they pick the experts
ADAPTERS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")
RECIPE = "tensorwise"
ZERO3_NOTE = ("ZeRO-3: the matmuls run in FP8, the weights' all-gather stays bf16 (torchao's FP8 all-gather is "
              "FSDP2's, which DeepSpeed does not use)")
CPU_ENV = "TRAINING_FP8_ON_CPU"
MEASURED_TORCH = (2, 11)  # the torch the measurement ran (auto asks for it or newer)
MIN_TORCH = (2, 6)  # torch.compiler.set_stance, which the loss guard's bf16 reference needs


def torchao_version() -> tuple[str | None, str]:
    """(torchao's version, "") when its float8 training imports, else (None, why not)."""
    try:
        import torchao
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: F401
    except Exception as e:  # an ImportError, or a torchao built for another torch: either way no FP8 here
        return None, f"torchao's float8 training does not import ({type(e).__name__}: {str(e)[:160]})"
    return str(torchao.__version__), ""


def capability_of(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def decide(given: str, *, method: str, model_config: dict, device: torch.device, bf16: bool, compiled: bool,
           moe: bool, deepspeed: bool = False, rows: int | None = None) -> tuple[bool, str]:
    """(FP8 on, why) for --fp8 `given`. method: full, lora or qlora; compiled: the decoder layers are compiled
    (the fast path's --compile); moe: a mixture of experts; deepspeed: the run is under DeepSpeed (gradient
    checkpointing, given or turned on by the memory probe, changes nothing: MEASURED_CKPT); rows: the tokens a
    GPU's micro-batch holds where known before the memory probe (--packing_tokens), else None (auto then looks
    again once they are known: short_rows). Raises InputError where `on` cannot run."""
    if given == "off":
        return False, "off as given"
    explicit = given == "on"
    hidden = int(model_config.get("hidden_size") or 0)
    cpu_allowed = explicit and os.environ.get(CPU_ENV) == "1"

    def no(why: str) -> tuple[bool, str]:
        if explicit:
            raise InputError(f"--fp8 on: {why}; use --fp8 auto (FP8 only where measured faster) or --fp8 off")
        return False, f"off: {why}"

    if method == "qlora":
        return no("Q-LoRA's 4-bit base dequantizes to bf16 for every matmul, there is no FP8 matmul to run")
    cap = capability_of(device)
    if device.type == "cpu" and not cpu_allowed:
        return no("no CUDA GPU (FP8 matmuls need an NVIDIA GPU of compute capability 8.9 or newer)")
    if cap is not None and cap < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return no(f"{name} is compute capability {cap[0]}.{cap[1]}, without FP8 tensor cores (8.9 or newer: Ada, "
                  "Hopper, Blackwell)")
    if getattr(torch.version, "hip", None) and not explicit:
        return no("FP8 was measured on NVIDIA GPUs only")
    if not bf16:
        return no("FP8 matmuls take bf16 activations: it needs --bf16")
    tv = torch_version()
    if tv < (MIN_TORCH if explicit else MEASURED_TORCH):
        want = MIN_TORCH if explicit else MEASURED_TORCH
        return no(f"torch {torch.__version__} is older than {want[0]}.{want[1]}"
                  + (" (FP8 was measured with torch 2.11)" if not explicit else " (the loss guard needs "
                     "torch.compiler.set_stance)"))
    if not explicit:  # what was measured, before torchao is imported (seconds of a start-up) for nothing
        if moe:
            return no("FP8 was not measured on a mixture of experts (its experts are not nn.Linear layers)")
        if not compiled:
            return no("FP8 was measured with compiled layers only (--compile)")
        smallest = AUTO_ON_FROM.get("full" if method == "full" else "lora")
        if smallest is None:
            return no(f"{NOT_FASTER['full']}; --fp8 on runs it anyway")
        if deepspeed:
            return no(f"{NOT_FASTER['deepspeed']}; --fp8 on runs it anyway")
        if hidden < smallest:
            return no(f"hidden size {hidden} is under {smallest}, the smallest measured faster through the worker "
                      f"({MEASURED}); --fp8 on runs it anyway")
        if rows is not None and rows < AUTO_MIN_ROW:
            return no(rows_why(rows, "--packing_tokens"))
    version, why_not = torchao_version()
    if version is None:
        return no(f"{why_not}: pip install torchao (the gpu extra, qwen-tui[gpu], brings it)")
    where = f"sm_{cap[0]}{cap[1]}" if cap else f"CPU ({CPU_ENV}=1)"
    if not explicit:
        return True, (f"on: a LoRA base of hidden size {hidden} without DeepSpeed ({MEASURED_ON}); torchao {version}, "
                      f"{RECIPE}, {where}" + ("" if rows is not None else "; rows checked once the memory probe "
                                             "has sized them"))
    why = f"on as given (torchao {version}, {RECIPE}, {where})"
    if not compiled:
        why += ("; without compiled layers torchao's casts run eagerly (and a frozen base's weight-gradient "
                "matmul is computed, then dropped): slower than with --compile")
        log.warning("--fp8 on without compiled layers (--no_compile, or a CPU run): torchao's casts run "
                    "eagerly, slower than with --compile")
    return True, why


def rows_why(tokens: int, source: str) -> str:
    return (f"off: a GPU's micro-batch holds about {tokens:,} tokens ({source}), under the {AUTO_MIN_ROW:,} FP8 was "
            f"measured faster from (7B LoRA ran 0.94x in rows of 4,096 tokens, 1.10-1.12x in rows of 8,192: "
            f"{RESULTS}.md, {MEASURED}); --fp8 on runs it anyway")


def row_tokens(capacity: int, step_tokens: float, sequence_parallel: int = 1) -> int:
    """The tokens a GPU's micro-batch holds on average: a step's `step_tokens` (a rank's records a step) packed into
    as few rows of `capacity` as hold them, each row split over the sequence-parallel group."""
    if step_tokens <= 0 or capacity <= 0:
        return 0
    rows = max(1, math.ceil(step_tokens / capacity))
    return int(min(step_tokens / rows, capacity) // max(sequence_parallel, 1))


def second_look(given: str, fast, stats, train, *, lazy: bool, max_length: int) -> str | None:
    """Auto's second look from the run itself, once the memory probe has sized the rows: why FP8 goes back off,
    or None. fast: the fast path's choices (its rows and packing); stats: the training data's
    DataStats (a record's mean length; `max_length`, a sample's longest, when --lazy_preprocess has not counted
    them); train: TrainFlags (records a step, sequence parallelism). Every rank sees the same rows and data, so
    every rank decides alike."""
    mean = stats.tokens / stats.records if stats.records and stats.tokens and not lazy else max_length
    mb, gas = train.per_device_train_batch_size, train.gradient_accumulation_steps
    if fast.packing:
        tokens = row_tokens(fast.packing_tokens or 0, mean * mb * gas, train.sequence_parallel_size)
        source = f"{mb * gas} records of {mean:,.0f} tokens on average a step in rows of {fast.packing_tokens or 0:,}"
    else:
        tokens, source = int(mean * mb), f"{mb} records of {mean:,.0f} tokens on average, padded"
    return short_rows(given, fast.fp8, tokens, source)


def short_rows(given: str, on: bool, tokens: int, source: str) -> str | None:
    """Auto's second look once the rows are sized: why FP8 goes back off (a GPU's micro-batch of `tokens` is
    under AUTO_MIN_ROW), or None to keep what decide() chose. `on` runs whatever the rows. Checkpointing, which the
    probe may have turned on, changes nothing: FP8 was measured faster with it too (MEASURED_CKPT)."""
    if given != "auto" or not on or tokens >= AUTO_MIN_ROW:
        return None
    return rows_why(tokens, source)


# ---------------------------------------------------------------- which layers


@dataclass
class Selection:
    """What select() chose: (name, module) to convert, and (name, out features, in features) skipped."""
    chosen: list[tuple[str, torch.nn.Module]] = field(default_factory=list)
    skipped: list[tuple[str, int, int]] = field(default_factory=list)
    routers: int = 0  # a mixture of experts' routing layers, left in bf16


def select(model, method: str) -> Selection:
    """The decoder layers' linears FP8 takes: names are relative to the decoder (`layers.3.mlp.up_proj`, with
    `.base_layer` under LoRA). Frozen ones only unless `method` is full."""
    sel = Selection()
    for i, layer in enumerate(decoder_of(model).layers):
        for name, mod in layer.named_modules():
            if type(mod) is not torch.nn.Linear:  # exactly nn.Linear: not a 4-bit one, not peft's wrapper
                continue
            parts = name.split(".")
            if any(p in ADAPTERS for p in parts):
                continue  # LoRA's own matmuls stay bf16
            leaf = parts[-2] if parts[-1] == "base_layer" and len(parts) > 1 else parts[-1]
            if leaf in ROUTERS:
                sel.routers += 1
                continue
            if method != "full" and mod.weight.requires_grad:
                continue  # under LoRA only the frozen base
            full = f"layers.{i}.{name}"
            if mod.in_features % ALIGN or mod.out_features % ALIGN:
                sel.skipped.append((full, mod.out_features, mod.in_features))
                continue
            sel.chosen.append((full, mod))
    return sel


@dataclass
class Fp8Layers:
    """The converted layers of a run and what the conversion said."""
    modules: list[torch.nn.Module]
    names: list[str]
    skipped: list[tuple[str, int, int]]
    routers: int
    torchao: str
    pad_inner_dim: bool
    active: bool = True  # False once restore() ran: the layers are nn.Linear again

    @property
    def converted(self) -> int:
        return len(self.modules)

    def record(self) -> dict:
        """The conversion for metrics.jsonl's fp8 event."""
        return {"converted": self.converted, "skipped": len(self.skipped),
                "skipped_layers": [{"name": n, "out_features": o, "in_features": i} for n, o, i in self.skipped[:32]],
                "routers_kept_bf16": self.routers, "recipe": RECIPE, "torchao": self.torchao,
                "pad_inner_dim": self.pad_inner_dim, "first_converted": self.names[:3]}

    def summary(self) -> str:
        s = (f"FP8 ({RECIPE}, torchao {self.torchao}): {self.converted} linear layers converted, "
             f"{len(self.skipped)} skipped")
        if self.skipped:
            shown = ", ".join(f"{n} ({o}x{i})" for n, o, i in self.skipped[:6])
            s += f" (dimensions not multiples of {ALIGN}: {shown}{' ...' if len(self.skipped) > 6 else ''})"
        if self.routers:
            s += f"; {self.routers} routers kept in bf16"
        return s

    @contextlib.contextmanager
    def bf16_matmuls(self):
        """The converted layers run nn.Linear's bf16 matmul, and every compiled function its eager code (the
        compiled graphs hold FP8 matmuls; with their layers swapped back they would compile again), until the
        context ends."""
        if not self.active:
            yield
            return
        from torchao.float8.float8_linear import Float8Linear

        for m in self.modules:
            m.__class__ = torch.nn.Linear
        try:
            with torch.compiler.set_stance("force_eager"):
                yield
        finally:
            for m in self.modules:
                m.__class__ = Float8Linear

    def restore(self) -> None:
        """Every converted layer back to nn.Linear for good (its weight never changed type)."""
        for m in self.modules:
            m.__class__ = torch.nn.Linear
        self.active = False


def convert(model, method: str, *, pad_inner_dim: bool) -> Fp8Layers:
    """Swaps the layers select() chooses for torchao's Float8Linear (tensorwise, dynamic scaling). pad_inner_dim:
    torchao pads a matmul's inner dimension to a multiple of 16 (rows of tokens that are not)."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    version, _ = torchao_version()
    sel = select(model, method)
    chosen = {id(m) for _, m in sel.chosen}
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(RECIPE), pad_inner_dim=pad_inner_dim)
    convert_to_float8_training(decoder_of(model), module_filter_fn=lambda mod, fqn: id(mod) in chosen,
                               config=config)
    modules, names = [], []
    for i, layer in enumerate(decoder_of(model).layers):
        for name, mod in layer.named_modules():
            if isinstance(mod, Float8Linear):
                modules.append(mod)
                names.append(f"layers.{i}.{name}")
    if len(modules) != len(chosen):
        raise RuntimeError(f"FP8: {len(chosen)} linear layers chosen, {len(modules)} converted")
    return Fp8Layers(modules, names, sel.skipped, sel.routers, version or "?", pad_inner_dim)
