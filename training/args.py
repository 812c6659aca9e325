"""Command-line flags of the worker.

Names follow Hugging Face TrainingArguments (and Qwen's finetune.py) so users
can bring their commands along: booleans take --x, --x True|False and --no_x, and
HF's other spellings (--evaluation_strategy, --report_to, --optim, ...) are mapped
or accepted with a warning (training.hf_flags).
parse_args returns them as typed groups (training.flags.WorkerFlags: `flags.train.learning_rate`), whose fields
hold each flag's default and help: the parser is generated from them.
Everything here is cheap: no torch import, so a bad flag fails in milliseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from training.flags import FLAG_GROUPS, WorkerFlags, field_group, flag_defaults
from training.hf_flags import add_bool, add_other_names, resolve
from training.runtime.errors import InputError

EPILOG = """\
examples:
  python -m training.finetune --model_name_or_path builtin:tiny --data_path builtin:demo-chat \\
      --output_dir out --use_lora --max_steps 40 --learning_rate 2e-3
  torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      -m training.finetune --model_name_or_path Qwen/Qwen2.5-7B-Instruct --data_path chat.jsonl \\
      --output_dir out --bf16 --use_lora --deepspeed training/ds_config_zero2.json

exit codes: 0 trained and saved; 2 bad input or configuration (nothing written); 1 anything else.
"""


def build_parser() -> argparse.ArgumentParser:
    """The parser, generated from training.flags: one argument group per group of flags, in their order, one flag
    per field with the field's help and default."""
    p = argparse.ArgumentParser(
        prog="python -m training.finetune",
        description="Fine-tune a Qwen2/2.5/3 chat model, dense or mixture-of-experts (Qwen3-MoE, Qwen2-MoE) "
        "(full, LoRA or Q-LoRA; DDP or DeepSpeed ZeRO-2/3). "
        "Run under torchrun for several processes or nodes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for group in FLAG_GROUPS.values():
        g = p.add_argument_group(group.TITLE, getattr(group, "DESCRIPTION", None))
        others_named = False
        for f in dataclasses.fields(group):
            if "no_effect" in f.metadata and not others_named:
                add_other_names(g)  # HF's names of the worker's own flags, before what it accepts with no effect
                others_named = True
            add_flag(g, f)
    _take_defaults(p)
    return p


def add_flag(group, f: dataclasses.Field) -> None:
    """One field of training.flags as its flag: the type from the field's annotation (a bool is spelled as HF
    spells booleans; a list takes one or more words), the rest from its metadata (training.flags.flag)."""
    meta = f.metadata
    if meta.get("hidden"):
        text = argparse.SUPPRESS
    elif "no_effect" in meta:
        text = f"accepted for HF compatibility; no effect: {meta['no_effect']}"
    else:
        text = meta["help"]
    kind = str(f.type).replace(" | None", "")
    if kind == "bool":
        add_bool(group, f.name, text, off=meta.get("off"))
        return
    kw: dict = {"help": text}
    if kind in _TYPES:
        kw["type"] = _TYPES[kind]
    elif kind == "list[str]":
        kw["nargs"] = "+"
    for key in ("choices", "metavar"):
        if key in meta:
            kw[key] = meta[key]
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        kw["required"] = True
    group.add_argument(f"--{f.name}", *meta.get("aliases", ()), dest=f.name, **kw)


_TYPES = {"int": int, "float": float}


def _take_defaults(p: argparse.ArgumentParser) -> None:
    """Every flag's default from its field in training.flags (the one place defaults live). A flag with no field
    fails here, when the parser is built, rather than vanishing from WorkerFlags."""
    dests = {a.dest for a in p._actions if a.dest != "help"}
    unknown = sorted(dests - set(field_group()))
    if unknown:
        raise TypeError(f"flags without a field in training.flags: {', '.join(unknown)}")
    p.set_defaults(**flag_defaults())


def parse_args(argv: list[str] | None = None) -> WorkerFlags:
    """Parses, resolves and checks flags. argparse exits with 2 on an unknown or malformed flag itself.

    `flags.notes.hf_warnings` holds one line for each HF flag given that has no effect here (the worker logs them)."""
    flags = WorkerFlags.from_namespace(build_parser().parse_args(argv))
    resolve_defaults(flags)
    flags.notes.hf_warnings = resolve(flags)
    check_args(flags)
    return flags


def resolve_defaults(flags: WorkerFlags) -> None:
    """The defaults that follow from other flags, and --lora_target_modules split into names."""
    if flags.lora.q_lora:
        flags.lora.use_lora = True
    if flags.save.metrics_file is None:
        flags.save.metrics_file = os.path.join(flags.train.output_dir, "metrics.jsonl")
    if flags.train.per_device_eval_batch_size is None:
        flags.train.per_device_eval_batch_size = flags.train.per_device_train_batch_size
    flags.lora.lora_target_modules = [m.strip() for item in flags.lora.lora_target_modules
                                      for m in item.split(",") if m.strip()]


def check_args(flags: WorkerFlags) -> None:
    m, d, t, s, f, lo = flags.model, flags.data, flags.train, flags.save, flags.fast, flags.lora
    positive = {"per_device_train_batch_size": t.per_device_train_batch_size,
                "per_device_eval_batch_size": t.per_device_eval_batch_size,
                "gradient_accumulation_steps": t.gradient_accumulation_steps, "model_max_length": d.model_max_length,
                "logging_steps": s.logging_steps, "lora_r": lo.lora_r, "lora_alpha": lo.lora_alpha}
    for name, value in positive.items():
        if value <= 0:
            raise InputError(f"--{name} must be positive, got {value}")
    if t.learning_rate <= 0:
        raise InputError(f"--learning_rate must be positive, got {t.learning_rate}")
    if t.max_steps <= 0 and t.num_train_epochs <= 0:
        raise InputError("give --max_steps > 0 or --num_train_epochs > 0")
    if not 0.0 <= t.warmup_ratio < 1.0:
        raise InputError(f"--warmup_ratio must be in [0, 1), got {t.warmup_ratio}")
    if not 0.0 <= lo.lora_dropout < 1.0:
        raise InputError(f"--lora_dropout must be in [0, 1), got {lo.lora_dropout}")
    if s.save_strategy == "steps" and s.save_steps <= 0:
        raise InputError(f"--save_steps must be positive with --save_strategy steps, got {s.save_steps}")
    if lo.use_lora and not lo.lora_target_modules:
        raise InputError("--lora_target_modules is empty")
    if lo.merge_lora and not lo.use_lora:
        raise InputError("--merge_lora needs --use_lora (there is no adapter to merge)")
    coef = flags.moe.router_aux_loss_coef
    if coef is not None and coef < 0:
        raise InputError(f"--router_aux_loss_coef must be 0 or more, got {coef:g}")
    if f.packing_tokens is not None and f.packing_tokens < d.model_max_length:
        raise InputError(f"--packing_tokens {f.packing_tokens} is less than --model_max_length "
                         f"{d.model_max_length}: the longest record must fit in one packed row")
    if not 0.05 <= f.auto_memory_fraction <= 1.0:
        raise InputError(f"--auto_memory_fraction must be in [0.05, 1], got {f.auto_memory_fraction}")
    if f.packing is False and (f.packing_tokens is not None or f.auto_micro_batch):
        raise InputError("--packing_tokens and --auto_micro_batch size packed rows; they need packing (drop --no_packing)")
    if s.profile_trace and s.profile_step <= 0:
        raise InputError("--profile_trace writes the trace of --profile_step N; give --profile_step too")
    if m.random_init and s.resume_from_checkpoint:
        raise InputError("--random_init would ignore the checkpoint's weights; drop it to resume")
    if d.tokenize_timeout <= 0:
        raise InputError(f"--tokenize_timeout must be positive, got {d.tokenize_timeout:g}")
    if t.sequence_parallel_size < 1:
        raise InputError(f"--sequence_parallel_size must be at least 1, got {t.sequence_parallel_size}")
    if s.heartbeat_interval <= 0:
        raise InputError(f"--heartbeat_interval must be positive, got {s.heartbeat_interval:g}")
    if d.model_max_length < 8:
        raise InputError(f"--model_max_length {d.model_max_length} is too short for a chat turn")
    check_fp8(flags)
    if not d.data_path and not d.datasets:
        raise InputError("give --data_path (one source) or --datasets (several mixed)")
    if d.data_path and d.datasets:
        raise InputError("--data_path and --datasets both name the data: give one")
    check_pref(flags)


def check_fp8(flags: WorkerFlags) -> None:
    """What --fp8 on needs of the other flags (the GPU and torchao are checked at set-up, training.fast.fp8)."""
    f = flags.fast
    if f.fp8_guard_steps < 0:
        raise InputError(f"--fp8_guard_steps must be 0 or more, got {f.fp8_guard_steps}")
    if f.fp8_parity_bound < 0:
        raise InputError(f"--fp8_parity_bound must be 0 or more, got {f.fp8_parity_bound:g}")
    if f.fp8 != "on":
        return
    if flags.lora.q_lora:
        raise InputError("--fp8 on cannot run with --q_lora: Q-LoRA's 4-bit base dequantizes to bf16 for every "
                         "matmul, there is no FP8 matmul to run; drop --fp8 on (or use --use_lora on a bf16 base)")
    if not flags.train.bf16:
        raise InputError("--fp8 on needs --bf16: torchao's FP8 matmuls take bf16 activations (measured that way); "
                         f"{'--fp16 is' if flags.train.fp16 else 'fp32 is'} not supported with it")


def check_pref(flags: WorkerFlags) -> None:
    """DPO's flags and what DPO needs of the others."""
    pr, d, f, t = flags.pref, flags.data, flags.fast, flags.train
    if pr.pref_beta <= 0:
        raise InputError(f"--pref_beta must be positive, got {pr.pref_beta:g}")
    if pr.pref_ftx < 0:
        raise InputError(f"--pref_ftx must be 0 or more, got {pr.pref_ftx:g}")
    if pr.stage != "dpo":
        return
    if f.packing is False:
        raise InputError("--stage dpo packs each pair's chosen and rejected answers into one row: drop --no_packing")
    if f.packing_tokens is not None and f.packing_tokens < 2 * d.model_max_length:
        raise InputError(f"--packing_tokens {f.packing_tokens} is less than 2 x --model_max_length "
                         f"{d.model_max_length}: a pair's two answers must fit in one packed row")
    if d.lazy_preprocess:
        raise InputError("--stage dpo tokenizes its pairs up front (the reference pass reads them all): drop "
                         "--lazy_preprocess")
    if t.sequence_parallel_size > 1:
        raise InputError("--stage dpo does not run with --sequence_parallel_size > 1 (a pair's row is never split)")
