"""Hugging Face TrainingArguments' spellings, so commands written for HF Trainer (Qwen's finetune_*.sh) run as
they are.

HF parses a boolean field as `--x`, `--x True|False` (any of yes/no, true/false, t/f, y/n, 1/0) and, for
fields that default to true, `--no_x`; every boolean here takes all three forms. Flags that HF Trainer has and
this worker does not implement are accepted with a one-line warning naming what happens instead
(`resolve` returns those lines), so a copied command neither fails nor silently means something else. The HF
group's flags and their help are HfFlags' fields (training.flags); the parser is generated from them
(training.args).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os

from training.flags import HfFlags, WorkerFlags
from training.runtime.errors import InputError
from training.runtime.trackers import default_logging_dir, which_trackers

TRUE_WORDS = {"true", "t", "yes", "y", "1", "on"}
FALSE_WORDS = {"false", "f", "no", "n", "0", "off"}

# HF's optimizer names that are the AdamW this worker trains with (torch.optim.AdamW, fused by --fused_adamw).
ADAMW = {"adamw_torch", "adamw_hf", "adamw", "adamw_torch_fused"}

# HF flags with no counterpart here -> why they have no effect (on each field of HfFlags). Each given prints one
# warning.
NO_EFFECT = {f.name: f.metadata["no_effect"] for f in dataclasses.fields(HfFlags) if "no_effect" in f.metadata}


def str2bool(text: str) -> bool:
    word = str(text).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (True/False, yes/no, 1/0), got {text!r}")


def add_bool(group, name: str, help: str, off: str | None = None) -> None:
    """--NAME, --NAME True|False and --no_NAME, as HF spells booleans (the default is the field's in
    training.flags: None keeps 'not given' visible). `off` documents --no_NAME."""
    group.add_argument(f"--{name}", dest=name, type=str2bool, nargs="?", const=True, metavar="BOOL", help=help)
    group.add_argument(f"--no_{name}", dest=name, action="store_false", help=off or argparse.SUPPRESS)


def add_other_names(group) -> None:
    """HF's names of flags that live in another group of the worker's: --no_cuda for --use_cpu."""
    group.add_argument("--no_cuda", dest="use_cpu", type=str2bool, nargs="?", const=True, metavar="BOOL",
                       help="HF's older name of --use_cpu")


def resolve(flags: WorkerFlags) -> list[str]:
    """Maps the HF spellings onto the worker's own flags; returns one warning per flag that has no effect."""
    hf, t, s = flags.hf, flags.train, flags.save
    warnings = []
    for name, why in NO_EFFECT.items():
        if getattr(hf, name) is not None:
            warnings.append(f"--{name} has no effect here: {why}")
    # Only rank 0 logs, so only it needs the trackers' packages (checked here, before anything loads).
    hf.report_to = which_trackers(hf.report_to, check=int(os.environ.get("RANK", "0")) == 0)
    if hf.logging_dir is None:
        hf.logging_dir = default_logging_dir(t.output_dir)
    if hf.run_name is None:
        hf.run_name = os.path.basename(os.path.normpath(os.path.abspath(t.output_dir)))
    if hf.node_gpu_file is None:
        hf.node_gpu_file = os.path.join(os.path.dirname(os.path.abspath(s.metrics_file)), "gpus.jsonl")
    if hf.optim not in ADAMW:
        warnings.append(f"--optim {hf.optim} has no effect here: the worker trains with AdamW "
                        "(or the optimizer of a --deepspeed config)")
    elif hf.optim == "adamw_torch_fused" and flags.fast.fused_adamw is None:
        flags.fast.fused_adamw = True
    if hf.eval_strategy is None:
        hf.eval_strategy = "steps" if s.eval_steps > 0 else "no"
    if hf.eval_strategy == "no":
        s.eval_steps = 0
    elif hf.eval_strategy == "steps" and s.eval_steps <= 0:
        s.eval_steps = s.logging_steps  # HF's default for eval_steps
    elif hf.eval_strategy == "epoch":
        s.eval_steps = 0  # the step loop evaluates at each epoch's last step
    if hf.warmup_steps < 0:
        raise InputError(f"--warmup_steps must be >= 0, got {hf.warmup_steps}")
    if hf.warmup_steps > 0 and t.max_steps > 0:
        t.warmup_ratio = warmup_ratio_for(hf.warmup_steps, t.max_steps)
    if t.bf16 and t.fp16:
        raise InputError("--bf16 and --fp16 are mutually exclusive; give one of them")
    return warnings


def warmup_ratio_for(steps: int, total: int) -> float:
    """The --warmup_ratio whose ceil(ratio x total) is exactly `steps` (the recipe's rounding), floats and all."""
    if steps >= total:
        raise InputError(f"--warmup_steps {steps} must be less than --max_steps {total}")
    ratio = steps / total
    while math.ceil(ratio * total) > steps:
        ratio = math.nextafter(ratio, 0.0)
    return ratio
