"""The worker's flags as typed groups, one per group of `--help`, and what set-up resolves from them.

Each group is a slotted dataclass, so a flag that is not declared here can neither be read nor set: a typo
fails at once instead of adding an attribute. Each field holds its flag's default and its help (`flag()`), so
the parser is generated from these groups (training.args.build_parser) and tests/training/test_args_flags.py
checks that every flag of the parser is one field of one group and every field one flag.

    flags.model   model            flags.save   saving and logging     flags.moe  mixture of experts
    flags.data    data             flags.fast   fast path switches      flags.hf   HF TrainingArguments spellings
    flags.train   training         flags.lora   LoRA / Q-LoRA           flags.notes  what parsing worked out
    flags.pref    preference training (DPO)

The flags stay as the user gave them (with the defaults parsing derives from other flags). What set-up decides
from them and from the run itself (its devices, its world, its storage) is a record of its own, Resolved, which
the recipe keeps and hands to the components that need it. The worker's components take the group they read
(`flags.train`, `flags.data`), not the whole WorkerFlags.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar

DEFAULT_LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
DATA_FORMATS = ("auto", "qwen", "sharegpt", "openai", "alpaca", "trl", "sharegpt_pref", "swift_pref")
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
              "inverse_sqrt")
EVAL_STRATEGIES = ("no", "steps", "epoch")


def flag(default: Any = MISSING, *, factory: Any = None, help: str | None = None, **spelling: Any) -> Any:
    """One flag's field: its default (or a factory of it; neither: the flag is required), its `--help` text and
    how the parser spells it beyond what the field's type says (training.args.add_flag reads them):

    off        the help of --no_NAME, for a switch whose off position is worth saying
    choices    the values it takes
    metavar    its value's name in --help
    aliases    more spellings of the same flag (--evaluation_strategy)
    no_effect  an HF flag accepted for compatibility: why it changes nothing here (warned once when given)
    hidden     accepted, not shown (--local_rank, which launchers pass)
    """
    meta = {"help": help, **spelling}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _ddp_timeout() -> int:
    return int(os.environ.get("QWEN_TUI_NCCL_TIMEOUT") or 1800)


@dataclass(slots=True, kw_only=True)
class ModelFlags:
    TITLE: ClassVar[str] = "model"
    model_name_or_path: str = flag(help="local model directory or hub id (Qwen2, Qwen2.5, Qwen3; GPTQ/AWQ -Int4 "
                                   "checkpoints for Q-LoRA); 'builtin:tiny' is a tiny offline Qwen2 built on first "
                                   "use ('builtin:tiny-moe', 'builtin:tiny-qwen2-moe': tiny mixture-of-experts ones)")
    random_init: bool = flag(False, help="build the model from its config.json with random weights instead of "
                             "loading them (benchmarks and smoke tests of a model shape; the directory needs no "
                             "weight files)")


@dataclass(slots=True, kw_only=True)
class DataFlags:
    TITLE: ClassVar[str] = "data"
    # parse_args: --data_path or --datasets is required
    data_path: str | None = flag(None, help="chat records (or, with --stage dpo, preference pairs): a JSON or "
                                 "JSON-lines file, a Parquet or Arrow file, a datasets.save_to_disk folder, or "
                                 "hf:ORG/NAME (a hub data set synced by `qwen-tui check --sync`); records in Qwen's "
                                 "{'conversations': [{'from', 'value'}]}, ShareGPT's (function_call/observation "
                                 "turns and 'tools' too), OpenAI's {'messages': [...]} (tool_calls, tool turns and "
                                 "'tools' too, or ms-swift's tool_call/tool_response) or alpaca's; "
                                 "'builtin:demo-chat' and 'builtin:demo-pref' are the shipped demo sets")
    # several sources mixed (training.data.sources): JSON, or a file holding it
    datasets: str | None = flag(None, metavar="JSON|FILE", help="several sources mixed instead of --data_path: a "
                                "JSON list (or a .json/.yaml file holding one) of {'path', 'format', 'weight' or "
                                "'records'}, or {'dataset_info': FILE, 'name': NAME} for an entry of "
                                "LLaMA-Factory's dataset_info.json; the mixture is the same for a --seed "
                                "(training/data/sources.py)")
    data_format: str = flag("auto", choices=DATA_FORMATS, help="the records' format (default auto: from each "
                            "record's keys)")
    eval_data_path: str | None = flag(None, help="optional evaluation file in the same formats; its loss is logged "
                                      "at the end (and every --eval_steps)")
    model_max_length: int = flag(8192, help="maximum tokens per record; longer records are truncated and counted "
                                 "(default 8192)")
    lazy_preprocess: bool = flag(False, help="tokenize records on the fly instead of all up front (records are "
                                 "still validated up front)")
    tokenized_cache_dir: str | None = flag(None, metavar="DIR|none", help="where the tokenized data is cached, "
                                           "keyed by the data's checksum, the tokenizer, the chat template and "
                                           "--model_max_length: local rank 0 of each node (one rank in all when "
                                           "every node sees DIR) tokenizes, the other ranks load it, a later run "
                                           "reuses it; 'none' tokenizes on every rank (default "
                                           "$QWEN_TUI_TOKENIZED_CACHE, else $XDG_CACHE_HOME/qwen-tui/tokenized or "
                                           "~/.cache/qwen-tui/tokenized)")
    tokenize_timeout: float = flag(3600.0, metavar="SECONDS", help="how long a rank waits for another rank's "
                                   "tokenized cache before it gives up (default 3600)")
    dataloader_num_workers: int = flag(0, help="data loader worker processes (default 0: tokenize in the training "
                                       "process)")


@dataclass(slots=True, kw_only=True)
class TrainFlags:
    TITLE: ClassVar[str] = "training"
    output_dir: str = flag(help="where checkpoints, the final model and metrics.jsonl go")
    per_device_train_batch_size: int = flag(8, help="micro-batch size per process (default 8)")
    # parse_args: the training micro-batch size when not given
    per_device_eval_batch_size: int | None = flag(None, help="evaluation batch size per process (default: the "
                                                  "training micro-batch size)")
    gradient_accumulation_steps: int = flag(1, help="micro-batches per optimizer step (default 1)")
    learning_rate: float = flag(5e-5, help="peak learning rate (default 5e-5)")
    num_train_epochs: float = flag(3.0, help="epochs to train (default 3; ignored if --max_steps > 0)")
    max_steps: int = flag(-1, help="optimizer steps to train; overrides --num_train_epochs when > 0")
    warmup_ratio: float = flag(0.0, help="fraction of steps for linear warm-up (default 0)")
    lr_scheduler_type: str = flag("linear", choices=SCHEDULERS, help="learning-rate schedule (default linear)")
    weight_decay: float = flag(0.0, help="AdamW weight decay, not applied to biases and norms (default 0)")
    adam_beta1: float = flag(0.9, help="AdamW beta1 (default 0.9)")
    adam_beta2: float = flag(0.999, help="AdamW beta2 (default 0.999; Qwen's recipes use 0.95)")
    adam_epsilon: float = flag(1e-8, help="AdamW epsilon (default 1e-8)")
    max_grad_norm: float = flag(1.0, help="gradient clipping norm; 0 disables (default 1.0)")
    bf16: bool = flag(False, help="train in bfloat16 mixed precision")
    fp16: bool = flag(False, help="train in float16 mixed precision (CUDA only; not with --bf16)")
    # None: the fast path decides (training.fast.long_context, apply)
    gradient_checkpointing: bool | None = flag(None, help="recompute activations in backward to save memory. "
                                               "Default: off, except that the fast path's memory probe turns it on "
                                               "where it is needed or pays (see --auto_micro_batch); "
                                               "--no_gradient_checkpointing keeps it off unless not even one record "
                                               "fits without it")
    seed: int = flag(42, help="seed for initialisation, dropout and data order (default 42)")
    deepspeed: str | None = flag(None, metavar="CONFIG", help="DeepSpeed JSON config, or a shipped one: "
                                 "builtin:zero2, builtin:zero3 (training/ds_config_zero*.json), optionally with "
                                 "_offload_optimizer or _offload_all (ZeRO-3); its 'auto' fields are filled from "
                                 "these flags; the ZeRO stage comes from it")
    sequence_parallel_size: int = flag(1, metavar="N", help="spread every packed row over N consecutive ranks "
                                       "(DeepSpeed's Ulysses attention): each holds 1/N of the row's tokens, so "
                                       "records N times longer fit; N divides the number of processes, and the "
                                       "model's attention heads divide among N ranks (default 1: off)")
    # None: decided at set-up (training.fast.long_context)
    tiled_mlp: bool | None = flag(None, help="compute every layer's MLP in tiles of --tiled_mlp_tokens tokens, "
                                  "forward and backward (DeepSpeed's TiledMLP): long records need a tile's MLP "
                                  "activations, not a row's, for one more MLP forward a step. Default: on where a "
                                  "rank's share of --model_max_length is over 32768 tokens (one process, ZeRO-1/2, "
                                  "or ZeRO-3 with sequence parallelism over all ranks)")
    tiled_mlp_tokens: int = flag(8192, metavar="N", help="tokens of one MLP tile with --tiled_mlp (default 8192; "
                                 "rows no longer run untiled)")
    # also set by the HF group's --no_cuda
    use_cpu: bool = flag(False, help="train on CPU with gloo (chosen automatically without CUDA)")
    ddp_timeout: int = flag(factory=_ddp_timeout, help="seconds a process waits for the others (process-group "
                            "set-up and collectives); default $QWEN_TUI_NCCL_TIMEOUT or 1800")


@dataclass(slots=True, kw_only=True)
class SaveFlags:
    TITLE: ClassVar[str] = "saving and logging"
    save_strategy: str = flag("steps", choices=("no", "steps", "epoch"), help="when to write checkpoints (default "
                              "steps)")
    save_steps: int = flag(500, help="checkpoint every N optimizer steps (default 500)")
    save_total_limit: int | None = flag(None, help="keep at most N checkpoints, deleting the oldest")
    save_on_each_node: bool = flag(False, help="every node writes its own checkpoints (clusters without shared "
                                   "storage)")
    resume_from_checkpoint: str | None = flag(None, metavar="PATH|auto", help="continue from a checkpoint "
                                              "directory, or 'auto' for the latest complete one in --output_dir")
    logging_steps: int = flag(1, help="write a metrics record every N optimizer steps (default 1)")
    eval_steps: int = flag(0, help="evaluate every N steps when --eval_data_path is given (default 0: at the end "
                           "only)")
    # parse_args: OUTPUT_DIR/metrics.jsonl when not given
    metrics_file: str | None = flag(None, help="metrics JSON-lines file (default OUTPUT_DIR/metrics.jsonl)")
    profile_step: int = flag(0, metavar="N", help="run optimizer step N under torch.profiler and write its most "
                             "expensive kernels to OUTPUT_DIR/profile-stepN.txt (main process; default 0: no "
                             "profile)")
    profile_trace: bool = flag(False, help="with --profile_step: also write the step's Chrome trace to "
                               "OUTPUT_DIR/profile-stepN.json.gz (open it in chrome://tracing or Perfetto; "
                               "bench/gpu_gaps.py lists where the GPU waited)")
    heartbeat_dir: str | None = flag(None, metavar="DIR", help="keep DIR/rank-<RANK>.json up to date for a monitor: "
                                     "the rank's step, the phase it is in (start, data, forward, backward, "
                                     "optimizer, collective, eval, checkpoint, done) and since when, rewritten "
                                     "every --heartbeat_interval seconds even while the rank waits; SIGUSR1 then "
                                     "writes every thread's stack to DIR/stack-rank-<RANK>.txt, and on CUDA "
                                     "PyTorch's NCCL flight recorder dumps to DIR/nccl_trace_rank_<RANK> on a "
                                     "collective timeout. DIR is relative to the working directory (default: none)")
    heartbeat_interval: float = flag(2.0, metavar="SECONDS", help="seconds between two writes of the heartbeat file "
                                     "(default 2)")


@dataclass(slots=True, kw_only=True)
class FastFlags:
    """The fast path's switches as given: None leaves the choice to training.fast.choice."""
    TITLE: ClassVar[str] = "fast path"
    DESCRIPTION: ClassVar[str] = (
        "Each switch is decided automatically when not given (the start record of metrics.jsonl and the log say "
        "what was chosen and why); every one can be turned off. Under --deepspeed (ZeRO-1/2/3) the engine wraps "
        "model + loss and the same switches apply; the memory probe runs once the engine has built its optimizer "
        "states.")
    packing: bool | None = flag(None, help="pack each optimizer step's records end to end into rows (no padding; "
                                "positions restart per record and no token attends across records). Default: on "
                                "where the attention supports packed rows (flash varlen on CUDA, per-record "
                                "attention on CPU)",
                                off="padded micro-batches of --per_device_train_batch_size records instead")
    packing_tokens: int | None = flag(None, metavar="N", help="tokens per packed row (one row is one micro-batch; a "
                                      "step's records take as many rows as they need, and every process runs the "
                                      "same number). Default: measured by --auto_micro_batch on CUDA, else "
                                      "--per_device_train_batch_size x --model_max_length")
    fused_ce: str = flag("auto", choices=("auto", "liger", "chunked", "off"), help="cross-entropy without the full "
                         "logits: Liger's fused linear cross-entropy (CUDA, needs liger-kernel) or a chunked torch "
                         "version (any device); off = transformers' own loss (full logits). Default auto: liger "
                         "where available, else chunked (under ZeRO-3 the partitioned LM head is gathered for the "
                         "loss)")
    compile: bool | None = flag(None, help="torch.compile each decoder layer (one graph shared by all layers). "
                                "Default: on for CUDA (with Triton), off on CPU; under ZeRO-3 each layer's forward "
                                "compiles inside DeepSpeed's hooks",
                                off="run the decoder eagerly")
    fused_adamw: bool | None = flag(None, help="single-kernel AdamW (torch's fused=True; under --deepspeed the "
                                    "client optimizer the engine steps). Default: on for CUDA, off on CPU",
                                    off="torch's default AdamW")
    auto_micro_batch: bool | None = flag(None, help="two probe micro-batches measure GPU memory and pick the "
                                         "largest --packing_tokens that fits --auto_memory_fraction of the GPU, "
                                         "turning gradient checkpointing on if not even one --model_max_length "
                                         "record fits without it, or if rows would be shorter than 8,192 tokens "
                                         "without it and checkpointing at least doubles them (under ZeRO-3 a "
                                         "micro-batch's gathers cost the same however short its row). Default: on "
                                         "for CUDA with packing, unless --packing_tokens is given; it never turns "
                                         "checkpointing off when --gradient_checkpointing is given",
                                         off="no memory probe: --packing_tokens (or its default) and "
                                         "--gradient_checkpointing as given")
    lora_input_cast: bool | None = flag(None, help="let peft cast each adapter's input to the adapter dtype (fp32) "
                                        "before its dropout, as peft does by default. Default: off on CUDA under "
                                        "--bf16/--fp16 without --deepspeed, where autocast casts the dropped input "
                                        "straight back to half precision for the matmul: the dropout then runs on "
                                        "the half-precision input (ATen computes it in fp32 and rounds once, the "
                                        "same values) with half the memory traffic; on elsewhere",
                                        off="adapter inputs stay in the compute dtype (see --lora_input_cast)")
    fused_lora_dropout: bool | None = flag(None, help="LoRA: each adapter's dropout drawn inside the Triton kernel "
                                           "of its first matmul (lora_A) and drawn again in its backward, instead "
                                           "of a dropout kernel and a saved mask and dropped copy per adapter. Same "
                                           "drop probability and scaling, masks from another generator. Needs CUDA "
                                           "and Triton; not with --deepspeed. It keeps less activation memory a "
                                           "token (longer packed rows, or no gradient checkpointing) at the same "
                                           "speed. Default: off",
                                           off="peft's own dropout module in front of each adapter")
    attention_kernel: str = flag("auto", choices=("auto", "flash", "cudnn"), help="the varlen attention of packed "
                                 "rows on CUDA: flash (PyTorch's FlashAttention 2) or cudnn (cuDNN's fused "
                                 "attention, the faster of the two; needs the nvidia-cudnn-frontend package and a "
                                 "Hopper or newer GPU). Default auto: cudnn where both are there and the frontend's "
                                 "backward plans can be sized for the widest row, else flash")
    labelled_logits_only: bool | None = flag(None, help="run the LM head and the loss only at the positions of a "
                                             "packed row whose next token is supervised: a prompt's tokens need no "
                                             "logits, and the LM head is the widest matmul of the model. The loss "
                                             "and its gradients are the same. Default: on with packing and a fused "
                                             "loss (liger or chunked); off with --fused_ce off, whose full logits "
                                             "are the reference",
                                             off="the LM head on every position of the row (unsupervised ones are "
                                             "masked out of the loss)")
    overlap_steps: bool | None = flag(None, help="queue the next optimizer step on the GPU before reading this "
                                      "step's loss and gradient norm back, so the GPU never waits for the host "
                                      "between steps (a step's metrics record is written once the next step is "
                                      "under way; the last step, evaluations, checkpoints and a profiled step still "
                                      "wait). Default: on for CUDA, off on CPU (where every operation waits anyway)",
                                      off="read each step's loss and gradient norm back before the next step starts")
    expandable_segments: bool | None = flag(None, help="PyTorch's expandable CUDA memory segments "
                                            "(PYTORCH_CUDA_ALLOC_CONF expandable_segments:True): packed rows change "
                                            "width every micro-batch, and near the memory limit the default "
                                            "allocator then frees its cache and retries, a device-wide "
                                            "synchronisation each time. Default: on for CUDA, unless "
                                            "PYTORCH_CUDA_ALLOC_CONF already sets expandable_segments",
                                            off="PyTorch's default CUDA allocator segments")
    auto_memory_fraction: float = flag(0.85, help="share of the GPU's memory --auto_micro_batch plans for (default "
                                       "0.85)")
    auto_max_tokens: int = flag(65536, help="largest packed row --auto_micro_batch may pick (default 65536)")
    fp8: str = flag("auto", choices=("auto", "on", "off"), help="FP8 matmuls through torchao's float8 training "
                    "(tensorwise scaling, dynamic casts, inside the compiled layers): full fine-tuning converts "
                    "the decoder's linear layers, LoRA the frozen base's (the adapters, the embedding and the LM "
                    "head stay bf16); layers whose dimensions are not multiples of 16 are skipped and named. Needs "
                    "--bf16, torchao, torch 2.6+ and an NVIDIA GPU of compute capability 8.9 or newer (Ada, "
                    "Hopper, Blackwell); not with --q_lora. The log and metrics.jsonl say how many layers were converted "
                    "and how many FP8 matmuls a profiled early step ran, and the first --fp8_guard_steps steps "
                    "compare the FP8 loss with bf16's on the same batch. Default auto: on only where it was measured "
                    "faster through the worker: a LoRA base of the 7B hidden size or wider, without --deepspeed, "
                    "once the rows hold 8,192+ tokens a GPU (1.10-1.12x of bf16 on an H100; 1.17x with gradient "
                    "checkpointing, 1.21x on an H200; 0.94x in rows of 4,096, 0.98-1.05x for full fine-tuning and under "
                    "DeepSpeed), else off, saying why; on: FP8 or a clear error")
    fp8_guard_steps: int = flag(8, metavar="N", help="with FP8 on: the first N optimizer steps also compute the "
                                "first micro-batch's loss with the FP8 layers run in bf16 (a no-grad forward, "
                                "eager), and compare; past --fp8_parity_bound, --fp8 auto goes back to bf16 and "
                                "--fp8 on stops the run (default 8; 0: no guard)")
    fp8_parity_bound: float = flag(0.02, metavar="REL", help="how far the FP8 loss may be from bf16's on the same "
                                   "batch and weights: REL x max(bf16 loss, 0.5) (default 0.02; FP8 measured "
                                   "0.13-0.45%% at the same weights on 7B and 1.5B shapes)")


@dataclass(slots=True, kw_only=True)
class LoraFlags:
    TITLE: ClassVar[str] = "LoRA / Q-LoRA"
    use_lora: bool = flag(False, help="train LoRA adapters (peft) instead of all weights")
    q_lora: bool = flag(False, help="Q-LoRA: LoRA on a 4-bit nf4 base (bitsandbytes) or on an already "
                        "GPTQ/AWQ-quantized checkpoint; implies --use_lora")
    lora_r: int = flag(64, help="LoRA rank (default 64)")
    lora_alpha: int = flag(16, help="LoRA alpha (default 16)")
    lora_dropout: float = flag(0.05, help="LoRA dropout (default 0.05)")
    # as given: comma- or space-separated items; parse_args splits them into one name an item
    lora_target_modules: list[str] = flag(factory=lambda: [DEFAULT_LORA_TARGETS], metavar="NAMES", help="module "
                                          "names to adapt, comma- or space-separated (Qwen's finetune.py takes a "
                                          f"list) (default: every decoder projection, {DEFAULT_LORA_TARGETS})")
    merge_lora: bool = flag(False, help="after a LoRA run also save the merged full model in OUTPUT_DIR/merged")


@dataclass(slots=True, kw_only=True)
class PrefFlags:
    """The second stage after supervised fine-tuning (LLaMA-Factory's names; TRL's in the help)."""
    TITLE: ClassVar[str] = "preference training (DPO)"
    stage: str = flag("sft", choices=("sft", "dpo"), help="sft: supervised fine-tuning on chat records (default); "
                      "dpo: direct preference optimisation on pairs of a chosen and a rejected answer, against the "
                      "model as it is at the start (its log-probabilities computed once before the first step: with "
                      "LoRA the base with the adapters disabled, no second copy of the model)")
    pref_beta: float = flag(0.1, help="DPO's beta (TRL's beta): how far the policy may move from the reference "
                            "(default 0.1)")
    pref_loss: str = flag("sigmoid", choices=("sigmoid", "ipo"), help="sigmoid: DPO's loss (default); ipo: IPO's, "
                          "on per-token averaged log-probabilities (TRL's loss_type)")
    pref_ftx: float = flag(0.0, help="weight of an SFT term on the chosen answer added to the loss (TRL's "
                           "rpo_alpha; default 0: off)")


@dataclass(slots=True, kw_only=True)
class MoeFlags:
    TITLE: ClassVar[str] = "mixture of experts (Qwen3-MoE, Qwen2-MoE)"
    router_aux_loss_coef: float | None = flag(None, metavar="COEF", help="weight of the routers' load-balancing "
                                              "loss added to the cross-entropy on every path (logged as aux_loss in "
                                              "metrics.jsonl); 0 leaves it out. Default: the model config's "
                                              "router_aux_loss_coef (0.001 in Qwen's releases)")
    experts_implementation: str = flag("auto", choices=("auto", "lean", "grouped_mm", "eager"), help="the kernel of "
                                       "the fused experts (transformers 5): lean (grouped matmuls, less kept for "
                                       "the backward), grouped_mm (transformers' grouped matmuls) or eager (a loop "
                                       "over the experts). Default auto: lean on CUDA where torch has a grouped "
                                       "matmul, eager elsewhere")
    train_router: bool = flag(False, help="train the routers (each sparse MoE block's gate): with LoRA they are "
                              "saved with the adapter (peft modules_to_save). Default: the routers stay frozen, "
                              "whatever the method")


@dataclass(slots=True, kw_only=True)
class HfFlags:
    """Hugging Face TrainingArguments' spellings (training.hf_flags): the first seven take effect, the rest are
    accepted with a warning (their `no_effect`) or quietly (local_rank, which launchers pass)."""
    TITLE: ClassVar[str] = "Hugging Face TrainingArguments compatibility"
    DESCRIPTION: ClassVar[str] = (
        "Accepted so that HF Trainer commands (Qwen's finetune_ds.sh, finetune_lora_ds.sh, finetune_qlora_ds.sh) "
        "run unchanged. Booleans also take --x True/False and --no_x.")
    eval_strategy: str | None = flag(None, choices=EVAL_STRATEGIES, aliases=("--evaluation_strategy",), help="no: "
                                     "evaluate --eval_data_path once, at the end; steps: also every --eval_steps "
                                     "(default --logging_steps); epoch: at the end of every epoch. Default: steps "
                                     "when --eval_steps > 0, else no")
    warmup_steps: int = flag(0, help="linear warm-up over N optimizer steps; overrides --warmup_ratio when > 0 "
                             "(needs --max_steps for now, else a warning)")
    optim: str = flag("adamw_torch", help="optimizer name: adamw_torch, adamw_hf or adamw mean AdamW (fused as "
                      "--fused_adamw decides); adamw_torch_fused turns --fused_adamw on; any other name warns that "
                      "AdamW is used")
    report_to: list[str] = flag(factory=lambda: ["none"], metavar="TRACKER", help="where rank 0 also logs the "
                                "metrics: tensorboard, wandb, mlflow (several, space- or comma-separated), all "
                                "(every one installed) or none (default: OUTPUT_DIR/metrics.jsonl only). wandb "
                                "reads WANDB_PROJECT (default qwen-tui), WANDB_MODE, WANDB_DIR; mlflow reads "
                                "MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME (default qwen-tui)")
    logging_dir: str | None = flag(None, help="TensorBoard's event files (default OUTPUT_DIR/runs/DATE_HOST, as HF)")
    run_name: str | None = flag(None, help="the run's name in W&B and MLflow (default: the output directory's name)")
    node_gpu_file: str | None = flag(None, metavar="PATH", help="JSON lines of every node's GPU load, appended by "
                                     "qwen-tui's monitor while it follows the run; with --report_to, rank 0 logs "
                                     "them beside the loss (default: gpus.jsonl beside --metrics_file)")
    logging_strategy: str | None = flag(None, no_effect="a metrics record is written every --logging_steps steps")
    cache_dir: str | None = flag(None, no_effect="models load from the Hugging Face cache (HF_HOME)")
    overwrite_output_dir: bool | None = flag(None, no_effect="checkpoints of the same step are replaced; resume with "
                                             "--resume_from_checkpoint auto")
    do_train: bool | None = flag(None, no_effect="the worker always trains")
    do_eval: bool | None = flag(None, no_effect="evaluation runs whenever --eval_data_path is given")
    disable_tqdm: bool | None = flag(None, no_effect="the worker logs one line a step and shows no progress bar")
    remove_unused_columns: bool | None = flag(None, no_effect="the worker builds its own batches")
    tf32: bool | None = flag(None, no_effect="matmul precision follows PyTorch's defaults")
    save_safetensors: bool | None = flag(None, no_effect="models are always saved as safetensors")
    lora_weight_path: str | None = flag(None, no_effect="LoRA adapters start from peft's initialisation")
    lora_bias: str | None = flag(None, no_effect="LoRA trains no biases (peft bias='none')")
    local_rank: int = flag(-1, hidden=True)  # what launchers pass (deepspeed's adds --local_rank): accepted quietly


@dataclass(slots=True)
class FlagNotes:
    """What parsing worked out about the flags, kept beside them; not flags themselves."""
    hf_warnings: list[str] = field(default_factory=list)  # one line per HF flag given that has no effect here


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


@dataclass(slots=True, kw_only=True)
class Resolved:
    """What set-up decides of the flags it cannot know at parse time, from the run itself: each field starts as
    its flag was given (Resolved.of) and set-up settles it; the flags keep what the user wrote. Components that run
    after set-up read these, never the flag of the same name."""
    save_on_each_node: bool  # off when output_dir turns out to be one filesystem for every node (recipe.setup)
    tiled_mlp: bool | None  # decided for the longest records a rank holds (training.fast.long_context)
    packing_tokens: int | None  # one longest record a row, where the memory probe cannot measure rows that long
    gradient_checkpointing: bool | None  # on with those rows (training.fast.long_context)
    expandable_segments: bool | None  # as the CUDA allocator will start (training.fast.allocator, before torch)
    expandable_why: str | None = None  # why expandable segments are on or off

    @classmethod
    def of(cls, flags: WorkerFlags) -> Resolved:
        """The flags set-up settles, as given."""
        return cls(save_on_each_node=flags.save.save_on_each_node, tiled_mlp=flags.train.tiled_mlp,
                   packing_tokens=flags.fast.packing_tokens, gradient_checkpointing=flags.train.gradient_checkpointing,
                   expandable_segments=flags.fast.expandable_segments)

    def by_name(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

