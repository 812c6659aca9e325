"""The worker's flags as typed groups, one per group of `--help` (training.args builds the parser from them).

Each group is a slotted dataclass, so a flag that is not declared here can neither be read nor set: a typo
fails at once instead of adding an attribute. The defaults live here and only here; the parser takes them
from these fields (training.args.build_parser), and tests/training/test_flags.py checks that every flag of the
parser is one field of one group and every field one flag.

    flags.model   model            flags.save   saving and logging     flags.moe  mixture of experts
    flags.data    data             flags.fast   fast path switches      flags.hf   HF TrainingArguments spellings
    flags.train   training         flags.lora   LoRA / Q-LoRA           flags.notes  what the worker worked out
    flags.pref    preference training (DPO)
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import ClassVar

DEFAULT_LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def _ddp_timeout() -> int:
    return int(os.environ.get("QWEN_TUI_NCCL_TIMEOUT") or 1800)


@dataclass(slots=True, kw_only=True)
class ModelFlags:
    TITLE: ClassVar[str] = "model"
    model_name_or_path: str
    random_init: bool = False


@dataclass(slots=True, kw_only=True)
class DataFlags:
    TITLE: ClassVar[str] = "data"
    data_path: str | None = None  # parse_args: --data_path or --datasets is required
    datasets: str | None = None  # several sources mixed (training.data.sources): JSON, or a file holding it
    data_format: str = "auto"
    eval_data_path: str | None = None
    model_max_length: int = 8192
    lazy_preprocess: bool = False
    tokenized_cache_dir: str | None = None
    tokenize_timeout: float = 3600.0
    dataloader_num_workers: int = 0


@dataclass(slots=True, kw_only=True)
class TrainFlags:
    TITLE: ClassVar[str] = "training"
    output_dir: str
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int | None = None  # parse_args: the training micro-batch size when not given
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-5
    num_train_epochs: float = 3.0
    max_steps: int = -1
    warmup_ratio: float = 0.0
    lr_scheduler_type: str = "linear"
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    bf16: bool = False
    fp16: bool = False
    gradient_checkpointing: bool | None = None  # None: the fast path decides (training.fast.long_context, apply)
    seed: int = 42
    deepspeed: str | None = None
    sequence_parallel_size: int = 1
    tiled_mlp: bool | None = None  # None: decided at set-up (training.fast.long_context)
    tiled_mlp_tokens: int = 8192
    use_cpu: bool = False  # also set by the HF group's --no_cuda
    ddp_timeout: int = field(default_factory=_ddp_timeout)


@dataclass(slots=True, kw_only=True)
class SaveFlags:
    TITLE: ClassVar[str] = "saving and logging"
    save_strategy: str = "steps"
    save_steps: int = 500
    save_total_limit: int | None = None
    save_on_each_node: bool = False
    resume_from_checkpoint: str | None = None
    logging_steps: int = 1
    eval_steps: int = 0
    metrics_file: str | None = None  # parse_args: OUTPUT_DIR/metrics.jsonl when not given
    profile_step: int = 0
    profile_trace: bool = False
    heartbeat_dir: str | None = None
    heartbeat_interval: float = 2.0


@dataclass(slots=True, kw_only=True)
class FastFlags:
    """The fast path's switches as given: None leaves the choice to training.fast.choice."""
    TITLE: ClassVar[str] = "fast path"
    packing: bool | None = None
    packing_tokens: int | None = None
    fused_ce: str = "auto"
    compile: bool | None = None
    fused_adamw: bool | None = None
    auto_micro_batch: bool | None = None
    lora_input_cast: bool | None = None
    fused_lora_dropout: bool | None = None
    attention_kernel: str = "auto"
    labelled_logits_only: bool | None = None
    overlap_steps: bool | None = None
    expandable_segments: bool | None = None
    auto_memory_fraction: float = 0.85
    auto_max_tokens: int = 65536


@dataclass(slots=True, kw_only=True)
class LoraFlags:
    TITLE: ClassVar[str] = "LoRA / Q-LoRA"
    use_lora: bool = False
    q_lora: bool = False
    lora_r: int = 64
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    # as given: comma- or space-separated items; parse_args splits them into one name an item
    lora_target_modules: list[str] = field(default_factory=lambda: [DEFAULT_LORA_TARGETS])
    merge_lora: bool = False


@dataclass(slots=True, kw_only=True)
class PrefFlags:
    """The second stage after supervised fine-tuning (LLaMA-Factory's names; TRL's in the help)."""
    TITLE: ClassVar[str] = "preference training (DPO)"
    stage: str = "sft"
    pref_beta: float = 0.1
    pref_loss: str = "sigmoid"
    pref_ftx: float = 0.0


@dataclass(slots=True, kw_only=True)
class MoeFlags:
    TITLE: ClassVar[str] = "mixture of experts (Qwen3-MoE, Qwen2-MoE)"
    router_aux_loss_coef: float | None = None
    experts_implementation: str = "auto"
    train_router: bool = False


@dataclass(slots=True, kw_only=True)
class HfFlags:
    """Hugging Face TrainingArguments' spellings (training.hf_flags): the first seven take effect, the rest are
    accepted with a warning (hf_flags.NO_EFFECT) or quietly (local_rank, which launchers pass)."""
    TITLE: ClassVar[str] = "Hugging Face TrainingArguments compatibility"
    eval_strategy: str | None = None
    warmup_steps: int = 0
    optim: str = "adamw_torch"
    report_to: list[str] = field(default_factory=lambda: ["none"])
    logging_dir: str | None = None
    run_name: str | None = None
    node_gpu_file: str | None = None
    logging_strategy: str | None = None
    cache_dir: str | None = None
    overwrite_output_dir: bool | None = None
    do_train: bool | None = None
    do_eval: bool | None = None
    disable_tqdm: bool | None = None
    remove_unused_columns: bool | None = None
    tf32: bool | None = None
    save_safetensors: bool | None = None
    lora_weight_path: str | None = None
    lora_bias: str | None = None
    local_rank: int = -1


@dataclass(slots=True)
class FlagNotes:
    """What the worker worked out about its flags, kept beside them; not flags themselves."""
    hf_warnings: list[str] = field(default_factory=list)  # one line per HF flag given that has no effect here
    expandable_why: str | None = None  # why expandable CUDA segments are on or off (training.fast.allocator)


# The attribute of WorkerFlags that holds each group.
FLAG_GROUPS: dict[str, type] = {"model": ModelFlags, "data": DataFlags, "train": TrainFlags, "save": SaveFlags,
                                "fast": FastFlags, "lora": LoraFlags, "pref": PrefFlags, "moe": MoeFlags,
                                "hf": HfFlags}


@dataclass(slots=True, kw_only=True)
class WorkerFlags:
    """Every flag of `python -m training.finetune`, by group: `flags.train.learning_rate`."""
    model: ModelFlags
    data: DataFlags
    train: TrainFlags
    save: SaveFlags = field(default_factory=SaveFlags)
    fast: FastFlags = field(default_factory=FastFlags)
    lora: LoraFlags = field(default_factory=LoraFlags)
    moe: MoeFlags = field(default_factory=MoeFlags)
    hf: HfFlags = field(default_factory=HfFlags)
    pref: PrefFlags = field(default_factory=PrefFlags)
    notes: FlagNotes = field(default_factory=FlagNotes)

    @classmethod
    def from_namespace(cls, ns) -> WorkerFlags:
        """Sorts the flat namespace argparse parsed into the groups (every flag is a field of one group)."""
        return cls(**{name: group(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(group)})
                      for name, group in FLAG_GROUPS.items()})

    def by_name(self) -> dict[str, object]:
        """Every flag by its own name (unique across the groups), and the notes: a run's configuration for the
        trackers."""
        groups = [getattr(self, name) for name in FLAG_GROUPS] + [self.notes]
        return {f.name: getattr(g, f.name) for g in groups for f in dataclasses.fields(g)}


def field_group() -> dict[str, str]:
    """Each flag's name -> the WorkerFlags attribute of its group."""
    return {f.name: name for name, group in FLAG_GROUPS.items() for f in dataclasses.fields(group)}


def flag_defaults() -> dict[str, object]:
    """Each flag's default (fresh lists, the environment read now); flags without one are required."""
    out: dict[str, object] = {}
    for group in FLAG_GROUPS.values():
        for f in dataclasses.fields(group):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
    return out
