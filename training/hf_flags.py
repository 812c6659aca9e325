"""Hugging Face TrainingArguments' spellings, so commands written for HF Trainer (Qwen's finetune_*.sh) run as
they are.

HF parses a boolean field as `--x`, `--x True|False` (any of yes/no, true/false, t/f, y/n, 1/0) and, for
fields that default to true, `--no_x`; every boolean here takes all three forms. Flags that HF Trainer has and
this worker does not implement are accepted with a one-line warning naming what happens instead
(`resolve` returns those lines), so a copied command neither fails nor silently means something else.
"""

from __future__ import annotations

import argparse
import math
import os

from training.flags import WorkerFlags
from training.runtime.errors import InputError
from training.runtime.trackers import default_logging_dir, which_trackers

TRUE_WORDS = {"true", "t", "yes", "y", "1", "on"}
FALSE_WORDS = {"false", "f", "no", "n", "0", "off"}

# HF's optimizer names that are the AdamW this worker trains with (torch.optim.AdamW, fused by --fused_adamw).
ADAMW = {"adamw_torch", "adamw_hf", "adamw", "adamw_torch_fused"}
EVAL_STRATEGIES = ["no", "steps", "epoch"]

# HF flags with no counterpart here: (argparse kwargs, why it has no effect). Each prints one warning if given.
NO_EFFECT = {
    "logging_strategy": ({}, "a metrics record is written every --logging_steps steps"),
    "cache_dir": ({}, "models load from the Hugging Face cache (HF_HOME)"),
    "overwrite_output_dir": ({"bool": True}, "checkpoints of the same step are replaced; resume with "
                             "--resume_from_checkpoint auto"),
    "do_train": ({"bool": True}, "the worker always trains"),
    "do_eval": ({"bool": True}, "evaluation runs whenever --eval_data_path is given"),
    "disable_tqdm": ({"bool": True}, "the worker logs one line a step and shows no progress bar"),
    "remove_unused_columns": ({"bool": True}, "the worker builds its own batches"),
    "tf32": ({"bool": True}, "matmul precision follows PyTorch's defaults"),
    "save_safetensors": ({"bool": True}, "models are always saved as safetensors"),
    "lora_weight_path": ({}, "LoRA adapters start from peft's initialisation"),
    "lora_bias": ({}, "LoRA trains no biases (peft bias='none')"),
}
# Quietly accepted: what launchers pass (deepspeed's launcher adds --local_rank; torchrun sets LOCAL_RANK).
SILENT = {"local_rank": {"type": int}}


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


def add_hf_flags(p: argparse.ArgumentParser) -> None:
    """The HF TrainingArguments flags that the worker maps onto its own, and those it only accepts."""
    h = p.add_argument_group(
        "Hugging Face TrainingArguments compatibility",
        "Accepted so that HF Trainer commands (Qwen's finetune_ds.sh, finetune_lora_ds.sh, finetune_qlora_ds.sh) "
        "run unchanged. Booleans also take --x True/False and --no_x.")
    h.add_argument("--eval_strategy", "--evaluation_strategy", dest="eval_strategy", choices=EVAL_STRATEGIES,
                   help="no: evaluate --eval_data_path once, at the end; steps: also every --eval_steps (default "
                   "--logging_steps); epoch: at the end of every epoch. Default: steps when --eval_steps > 0, "
                   "else no")
    h.add_argument("--warmup_steps", type=int,
                   help="linear warm-up over N optimizer steps; overrides --warmup_ratio when > 0 (needs --max_steps "
                   "for now, else a warning)")
    h.add_argument("--optim",
                   help="optimizer name: adamw_torch, adamw_hf or adamw mean AdamW (fused as --fused_adamw decides); "
                   "adamw_torch_fused turns --fused_adamw on; any other name warns that AdamW is used")
    h.add_argument("--report_to", nargs="+", metavar="TRACKER",
                   help="where rank 0 also logs the metrics: tensorboard, wandb, mlflow (several, space- or "
                   "comma-separated), all (every one installed) or none (default: OUTPUT_DIR/metrics.jsonl only). "
                   "wandb reads WANDB_PROJECT (default qwen-tui), WANDB_MODE, WANDB_DIR; mlflow reads "
                   "MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME (default qwen-tui)")
    h.add_argument("--logging_dir",
                   help="TensorBoard's event files (default OUTPUT_DIR/runs/DATE_HOST, as HF)")
    h.add_argument("--run_name",
                   help="the run's name in W&B and MLflow (default: the output directory's name)")
    h.add_argument("--node_gpu_file", metavar="PATH",
                   help="JSON lines of every node's GPU load, appended by qwen-tui's monitor while it follows the "
                   "run; with --report_to, rank 0 logs them beside the loss (default: gpus.jsonl beside "
                   "--metrics_file)")
    h.add_argument("--no_cuda", dest="use_cpu", type=str2bool, nargs="?", const=True, metavar="BOOL",
                   help="HF's older name of --use_cpu")  # the training group's field, spelled the HF way
    for name, (kw, why) in NO_EFFECT.items():
        text = f"accepted for HF compatibility; no effect: {why}"
        if kw.get("bool"):
            add_bool(h, name, text)
        else:
            h.add_argument(f"--{name}", help=text)
    for name, kw in SILENT.items():
        h.add_argument(f"--{name}", help=argparse.SUPPRESS, **kw)


def resolve(flags: WorkerFlags) -> list[str]:
    """Maps the HF spellings onto the worker's own flags; returns one warning per flag that has no effect."""
    hf, t, s = flags.hf, flags.train, flags.save
    warnings = []
    for name, (_, why) in NO_EFFECT.items():
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
