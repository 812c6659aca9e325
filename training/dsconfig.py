"""DeepSpeed JSON configs: read, check and fill their "auto" fields from the flags.

The shipped configs leave batch sizes, accumulation, clipping and precision
as "auto", so the command line is the single source of truth; a number in the
config that contradicts a flag is an error rather than a silent winner.
Light on purpose (json only), so a broken config fails before torch loads.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from pathlib import Path

from training.flags import TrainFlags
from training.runtime.errors import InputError

log = logging.getLogger("training")


SHIPPED = {2: Path(__file__).with_name("ds_config_zero2.json"), 3: Path(__file__).with_name("ds_config_zero3.json")}
BUILTIN_RE = re.compile(r"^builtin:zero([23])(?:_offload_(optimizer|all))?$")


def load(path: str) -> dict:
    """Reads a DeepSpeed config file, or a shipped one by name.

    `builtin:zero2`, `builtin:zero3` are the shipped files; `_offload_optimizer`
    adds ZeRO-Offload of the optimizer state to CPU, `_offload_all` (ZeRO-3 only)
    of the parameters too.
    """
    if path.startswith("builtin:"):
        return _builtin(path)
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{path}: DeepSpeed config not found")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: DeepSpeed config is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read DeepSpeed config: {e}") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: DeepSpeed config must be a JSON object")
    stage = zero_stage(cfg)
    if stage not in (0, 1, 2, 3):
        raise InputError(f"{path}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    return cfg


def _builtin(name: str) -> dict:
    m = BUILTIN_RE.match(name)
    if not m:
        raise InputError(f"--deepspeed {name}: unknown built-in config; known: builtin:zero2, builtin:zero3, "
                         "with an optional _offload_optimizer or _offload_all suffix")
    stage, offload = int(m.group(1)), m.group(2)
    cfg = json.loads(SHIPPED[stage].read_text(encoding="utf-8"))
    zo = cfg["zero_optimization"]
    if offload:
        zo["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload == "all":
        if stage != 3:
            raise InputError(f"--deepspeed {name}: ZeRO-2 cannot offload parameters; "
                             "use builtin:zero2_offload_optimizer or builtin:zero3_offload_all")
        zo["offload_param"] = {"device": "cpu", "pin_memory": True}
    return cfg


def zero_stage(cfg: dict | None) -> int:
    if not cfg:
        return 0
    zo = cfg.get("zero_optimization") or {}
    return zo.get("stage", 0) if isinstance(zo, dict) else -1


def _set(path: str, cfg: dict, section: dict, key: str, value) -> None:
    """Fills "auto" (or a missing key); an explicit different value conflicts with the flags."""
    cur = section.get(key, "auto")
    if cur == "auto":
        section[key] = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(cur, (int, float)):
        if abs(float(cur) - float(value)) > 1e-12 * max(1.0, abs(float(value))):
            raise InputError(f"{path}: '{key}' is {cur} but the command line gives {value}; set it to \"auto\"")
    elif cur != value:
        raise InputError(f"{path}: '{key}' is {cur!r} but the command line gives {value!r}; set it to \"auto\"")


def layer_numel(model_config: dict) -> int:
    """Parameters of one decoder layer of a Qwen2/2.5/3 config (projections; norms and biases are noise here);
    of a mixture-of-experts layer, every expert's (training.model.moe)."""
    from training.model.moe import layer_numel as moe_layer_numel

    moe = moe_layer_numel(model_config)
    if moe is not None:
        return moe
    h = int(model_config.get("hidden_size") or 4096)
    heads = int(model_config.get("num_attention_heads") or 32)
    kv = int(model_config.get("num_key_value_heads") or heads) * int(model_config.get("head_dim") or h // heads)
    inter = int(model_config.get("intermediate_size") or 4 * h)
    return h * (h + 2 * kv) + heads * (h // heads) * h + 3 * h * inter


def fill(path: str, raw: dict, train: TrainFlags, world_size: int, hidden_size: int, on_cpu: bool,
         layer_params: int | None = None, compiled: bool = False, on_each_node: bool = False) -> dict:
    """The config with its "auto" fields filled from `train`'s flags. on_each_node: --save_on_each_node as set-up
    resolved it (each node's checkpoints on its own storage). layer_params: one decoder layer's parameters; ZeRO-3
    gathers a layer at a time (training.fast.zero3), so its "auto" prefetch bucket holds the next layer whole.
    compiled: the decoder layers are compiled. ZeRO-3's memory-efficient linear (its default) replaces
    F.linear by an autograd function that reads each weight's ZeRO id, and Dynamo compiles every layer anew
    for its ids until the recompile limit leaves the rest eager (seen on an H200): it is turned off unless the
    config sets it."""
    cfg = copy.deepcopy(raw)
    mb, gas = train.per_device_train_batch_size, train.gradient_accumulation_steps
    _set(path, cfg, cfg, "train_micro_batch_size_per_gpu", mb)
    _set(path, cfg, cfg, "gradient_accumulation_steps", gas)
    _set(path, cfg, cfg, "train_batch_size", mb * gas * world_size)
    _set(path, cfg, cfg, "gradient_clipping", train.max_grad_norm)
    for name, on in (("bf16", train.bf16), ("fp16", train.fp16)):
        section = cfg.setdefault(name, {})
        if section.get("enabled", "auto") == "auto":
            section["enabled"] = on
        elif bool(section["enabled"]) != on:
            raise InputError(f"{path}: '{name}.enabled' is {section['enabled']} but --{name} is "
                             f"{'given' if on else 'not given'}; set it to \"auto\"")

    zo = cfg.setdefault("zero_optimization", {})
    if zo.get("reduce_bucket_size") == "auto":
        zo["reduce_bucket_size"] = hidden_size * hidden_size
    if zo.get("stage3_prefetch_bucket_size") == "auto":
        # transformers' rule (0.9 h^2) is a tenth of a 7B layer: the next layer's gather would never start early.
        zo["stage3_prefetch_bucket_size"] = max(int(0.9 * hidden_size * hidden_size), int(1.1 * (layer_params or 0)))
    if zo.get("stage3_param_persistence_threshold") == "auto":
        zo["stage3_param_persistence_threshold"] = 10 * hidden_size
    if compiled and zo.get("stage", 0) == 3:
        zo.setdefault("memory_efficient_linear", False)
    if zo.get("stage3_gather_16bit_weights_on_model_save") == "auto":
        zo["stage3_gather_16bit_weights_on_model_save"] = True

    offload = (zo.get("offload_optimizer") or {}).get("device", "none") not in ("none", None)
    if offload and "optimizer" not in cfg and not on_cpu:
        # ZeRO-Offload wants DeepSpeed's own CPU Adam, which it only builds from a config section.
        cfg["optimizer"] = {"type": "AdamW", "params": {}}
    elif offload and "optimizer" not in cfg:
        # On CPU the partitions live on the CPU anyway: the worker's own torch AdamW steps them (DeepSpeed's CPU Adam
        # would first compile a C++ op for a minute), which DeepSpeed accepts once told so.
        cfg.setdefault("zero_force_ds_cpu_optimizer", False)
    if "optimizer" in cfg:
        params = cfg["optimizer"].setdefault("params", {})
        _set(path, cfg, params, "lr", train.learning_rate)
        _set(path, cfg, params, "betas", [train.adam_beta1, train.adam_beta2])
        _set(path, cfg, params, "eps", train.adam_epsilon)
        _set(path, cfg, params, "weight_decay", train.weight_decay)
        if on_cpu and not offload:
            params.setdefault("torch_adam", True)  # FusedAdam would compile a CUDA-less op for a minute
    if "scheduler" in cfg:
        log.warning("%s: ignoring its 'scheduler' section: --lr_scheduler_type/--warmup_ratio set the schedule", path)
        del cfg["scheduler"]
    cfg.setdefault("steps_per_print", 10**9)  # we log ourselves
    if on_each_node:
        cfg.setdefault("checkpoint", {})["use_node_local_storage"] = True

    leftover = [k for k, v in _walk(cfg) if v == "auto"]
    if leftover:
        raise InputError(f"{path}: cannot fill \"auto\" for {', '.join(leftover)}")
    return cfg


def _walk(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _walk(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v
