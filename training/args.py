"""Command-line flags of the worker.

Names follow Hugging Face TrainingArguments (and Qwen's finetune.py) so users
can bring their commands along: booleans take --x, --x True|False and --no_x, and
HF's other spellings (--evaluation_strategy, --report_to, --optim, ...) are mapped
or accepted with a warning (training.hf_flags).
parse_args returns them as typed groups (training.flags.WorkerFlags: `flags.train.learning_rate`), whose fields
hold the defaults; the parser here holds the spelling and the help of each flag.
Everything here is cheap: no torch import, so a bad flag fails in milliseconds.
"""

from __future__ import annotations

import argparse
import os

from training.flags import DEFAULT_LORA_TARGETS, WorkerFlags, field_group, flag_defaults
from training.hf_flags import add_bool, add_hf_flags, resolve
from training.runtime.errors import InputError

SCHEDULERS = ["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt"]

EPILOG = """\
examples:
  python -m training.finetune --model_name_or_path builtin:tiny --data_path builtin:demo-chat \\
      --output_dir out --use_lora --max_steps 40 --learning_rate 2e-3
  torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      -m training.finetune --model_name_or_path Qwen/Qwen2.5-7B-Instruct --data_path chat.jsonl \\
      --output_dir out --bf16 --use_lora --deepspeed training/ds_config_zero2.json

exit codes: 0 trained and saved; 2 bad input or configuration (nothing written); 1 anything else.
"""


def _switch(group, name: str, on: str, off: str) -> None:
    """--NAME [True|False] and --no_NAME: one fast-path switch whose default (None) leaves the choice to
    training.fast.choice."""
    add_bool(group, name, on, off=off)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.finetune",
        description="Fine-tune a Qwen2/2.5/3 chat model, dense or mixture-of-experts (Qwen3-MoE, Qwen2-MoE) "
        "(full, LoRA or Q-LoRA; DDP or DeepSpeed ZeRO-2/3). "
        "Run under torchrun for several processes or nodes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    m = p.add_argument_group("model")
    m.add_argument("--model_name_or_path", required=True,
                   help="local model directory or hub id (Qwen2, Qwen2.5, Qwen3; GPTQ/AWQ -Int4 checkpoints for Q-LoRA); "
                   "'builtin:tiny' is a tiny offline Qwen2 built on first use ('builtin:tiny-moe', "
                   "'builtin:tiny-qwen2-moe': tiny mixture-of-experts ones)")

    add_bool(m, "random_init",
                   help="build the model from its config.json with random weights instead of loading them "
                   "(benchmarks and smoke tests of a model shape; the directory needs no weight files)")

    d = p.add_argument_group("data")
    d.add_argument("--data_path",
                   help="chat records (or, with --stage dpo, preference pairs): a JSON or JSON-lines file, a Parquet "
                   "or Arrow file, a datasets.save_to_disk folder, or hf:ORG/NAME (a hub data set synced by "
                   "`qwen-tui check --sync`); records in Qwen's {'conversations': [{'from', 'value'}]}, ShareGPT's "
                   "(function_call/observation turns and 'tools' too), OpenAI's {'messages': [...]} (tool_calls, "
                   "tool turns and 'tools' too, or ms-swift's tool_call/tool_response) or alpaca's; "
                   "'builtin:demo-chat' and 'builtin:demo-pref' are the shipped demo sets")
    d.add_argument("--datasets", metavar="JSON|FILE",
                   help="several sources mixed instead of --data_path: a JSON list (or a .json/.yaml file holding "
                   "one) of {'path', 'format', 'weight' or 'records'}, or {'dataset_info': FILE, 'name': NAME} "
                   "for an entry of LLaMA-Factory's dataset_info.json; the mixture is the same for a --seed "
                   "(training/data/sources.py)")
    d.add_argument("--data_format", choices=["auto", "qwen", "sharegpt", "openai", "alpaca", "trl", "sharegpt_pref",
                                             "swift_pref"],
                   help="the records' format (default auto: from each record's keys)")
    d.add_argument("--eval_data_path", help="optional evaluation file in the same formats; "
                   "its loss is logged at the end (and every --eval_steps)")
    d.add_argument("--model_max_length", type=int,
                   help="maximum tokens per record; longer records are truncated and counted (default 8192)")
    add_bool(d, "lazy_preprocess",
                   help="tokenize records on the fly instead of all up front (records are still validated up front)")
    d.add_argument("--tokenized_cache_dir", metavar="DIR|none",
                   help="where the tokenized data is cached, keyed by the data's checksum, the tokenizer, the chat "
                   "template and --model_max_length: local rank 0 of each node (one rank in all when every node "
                   "sees DIR) tokenizes, the other ranks load it, a later run reuses it; 'none' tokenizes on every "
                   "rank (default $QWEN_TUI_TOKENIZED_CACHE, else $XDG_CACHE_HOME/qwen-tui/tokenized or ~/.cache/qwen-tui/tokenized)")
    d.add_argument("--tokenize_timeout", type=float, metavar="SECONDS",
                   help="how long a rank waits for another rank's tokenized cache before it gives up (default 3600)")
    d.add_argument("--dataloader_num_workers", type=int,
                   help="data loader worker processes (default 0: tokenize in the training process)")

    t = p.add_argument_group("training")
    t.add_argument("--output_dir", required=True, help="where checkpoints, the final model and metrics.jsonl go")
    t.add_argument("--per_device_train_batch_size", type=int, help="micro-batch size per process (default 8)")
    t.add_argument("--per_device_eval_batch_size", type=int,
                   help="evaluation batch size per process (default: the training micro-batch size)")
    t.add_argument("--gradient_accumulation_steps", type=int,
                   help="micro-batches per optimizer step (default 1)")
    t.add_argument("--learning_rate", type=float, help="peak learning rate (default 5e-5)")
    t.add_argument("--num_train_epochs", type=float, help="epochs to train (default 3; ignored if --max_steps > 0)")
    t.add_argument("--max_steps", type=int, help="optimizer steps to train; overrides --num_train_epochs when > 0")
    t.add_argument("--warmup_ratio", type=float, help="fraction of steps for linear warm-up (default 0)")
    t.add_argument("--lr_scheduler_type", choices=SCHEDULERS, help="learning-rate schedule (default linear)")
    t.add_argument("--weight_decay", type=float, help="AdamW weight decay, not applied to biases and norms (default 0)")
    t.add_argument("--adam_beta1", type=float, help="AdamW beta1 (default 0.9)")
    t.add_argument("--adam_beta2", type=float, help="AdamW beta2 (default 0.999; Qwen's recipes use 0.95)")
    t.add_argument("--adam_epsilon", type=float, help="AdamW epsilon (default 1e-8)")
    t.add_argument("--max_grad_norm", type=float, help="gradient clipping norm; 0 disables (default 1.0)")
    add_bool(t, "bf16", help="train in bfloat16 mixed precision")
    add_bool(t, "fp16", help="train in float16 mixed precision (CUDA only; not with --bf16)")
    add_bool(t, "gradient_checkpointing",
             help="recompute activations in backward to save memory. Default: off, except that the fast path's "
                  "memory probe turns it on where it is needed or pays (see --auto_micro_batch); "
                  "--no_gradient_checkpointing keeps it off unless not even one record fits without it")
    t.add_argument("--seed", type=int, help="seed for initialisation, dropout and data order (default 42)")
    t.add_argument("--deepspeed", metavar="CONFIG",
                   help="DeepSpeed JSON config, or a shipped one: builtin:zero2, builtin:zero3 (training/ds_config_zero*.json), "
                   "optionally with _offload_optimizer or _offload_all (ZeRO-3); its 'auto' fields are filled from "
                   "these flags; the ZeRO stage comes from it")
    t.add_argument("--sequence_parallel_size", type=int, metavar="N",
                   help="spread every packed row over N consecutive ranks (DeepSpeed's Ulysses attention): each "
                   "holds 1/N of the row's tokens, so records N times longer fit; N divides the number of "
                   "processes, and the model's attention heads divide among N ranks (default 1: off)")
    add_bool(t, "tiled_mlp",
             help="compute every layer's MLP in tiles of --tiled_mlp_tokens tokens, forward and backward "
             "(DeepSpeed's TiledMLP): long records need a tile's MLP activations, not a row's, for one more MLP "
             "forward a step. Default: on where a rank's share of --model_max_length is over 32768 tokens (one "
             "process, ZeRO-1/2, or ZeRO-3 with sequence parallelism over all ranks)")
    t.add_argument("--tiled_mlp_tokens", type=int, metavar="N",
                   help="tokens of one MLP tile with --tiled_mlp (default 8192; rows no longer run untiled)")
    add_bool(t, "use_cpu", help="train on CPU with gloo (chosen automatically without CUDA)")
    t.add_argument("--ddp_timeout", type=int,
                   help="seconds a process waits for the others (process-group set-up and collectives); "
                   "default $QWEN_TUI_NCCL_TIMEOUT or 1800")

    s = p.add_argument_group("saving and logging")
    s.add_argument("--save_strategy", choices=["no", "steps", "epoch"],
                   help="when to write checkpoints (default steps)")
    s.add_argument("--save_steps", type=int, help="checkpoint every N optimizer steps (default 500)")
    s.add_argument("--save_total_limit", type=int, help="keep at most N checkpoints, deleting the oldest")
    add_bool(s, "save_on_each_node",
                   help="every node writes its own checkpoints (clusters without shared storage)")
    s.add_argument("--resume_from_checkpoint", metavar="PATH|auto",
                   help="continue from a checkpoint directory, or 'auto' for the latest complete one in --output_dir")
    s.add_argument("--logging_steps", type=int, help="write a metrics record every N optimizer steps (default 1)")
    s.add_argument("--eval_steps", type=int, help="evaluate every N steps when --eval_data_path is given (default 0: at the end only)")
    s.add_argument("--metrics_file", help="metrics JSON-lines file (default OUTPUT_DIR/metrics.jsonl)")
    s.add_argument("--profile_step", type=int, metavar="N",
                   help="run optimizer step N under torch.profiler and write its most expensive kernels to "
                   "OUTPUT_DIR/profile-stepN.txt (main process; default 0: no profile)")
    add_bool(s, "profile_trace",
                   help="with --profile_step: also write the step's Chrome trace to OUTPUT_DIR/profile-stepN.json.gz "
                   "(open it in chrome://tracing or Perfetto; bench/gpu_gaps.py lists where the GPU waited)")
    s.add_argument("--heartbeat_dir", metavar="DIR",
                   help="keep DIR/rank-<RANK>.json up to date for a monitor: the rank's step, the phase it is in "
                   "(start, data, forward, backward, optimizer, collective, eval, checkpoint, done) and since when, "
                   "rewritten every --heartbeat_interval seconds even while the rank waits; SIGUSR1 then writes every "
                   "thread's stack to DIR/stack-rank-<RANK>.txt, and on CUDA PyTorch's NCCL flight recorder dumps "
                   "to DIR/nccl_trace_rank_<RANK> on a collective timeout. DIR is relative to the working "
                   "directory (default: none)")
    s.add_argument("--heartbeat_interval", type=float, metavar="SECONDS",
                   help="seconds between two writes of the heartbeat file (default 2)")

    f = p.add_argument_group(
        "fast path", "Each switch is decided automatically when not given (the start record of metrics.jsonl and the "
        "log say what was chosen and why); every one can be turned off. Under --deepspeed (ZeRO-1/2/3) the engine "
        "wraps model + loss and the same switches apply; the memory probe runs once the engine has built its "
        "optimizer states.")
    _switch(f, "packing",
            on="pack each optimizer step's records end to end into rows (no padding; positions restart per "
               "record and no token attends across records). Default: on where the attention supports packed "
               "rows (flash varlen on CUDA, per-record attention on CPU)",
            off="padded micro-batches of --per_device_train_batch_size records instead")
    f.add_argument("--packing_tokens", type=int, metavar="N",
                   help="tokens per packed row (one row is one micro-batch; a step's records take as many rows as "
                   "they need, and every process runs the same number). Default: measured by --auto_micro_batch on "
                   "CUDA, else --per_device_train_batch_size x --model_max_length")
    f.add_argument("--fused_ce", choices=["auto", "liger", "chunked", "off"],
                   help="cross-entropy without the full logits: Liger's fused linear cross-entropy (CUDA, needs "
                   "liger-kernel) or a chunked torch version (any device); off = transformers' own loss (full "
                   "logits). Default auto: liger where available, else chunked (under ZeRO-3 the partitioned LM head "
                   "is gathered for the loss)")
    _switch(f, "compile",
            on="torch.compile each decoder layer (one graph shared by all layers). Default: on for CUDA "
               "(with Triton), off on CPU; under ZeRO-3 each layer's forward compiles inside DeepSpeed's hooks",
            off="run the decoder eagerly")
    _switch(f, "fused_adamw",
            on="single-kernel AdamW (torch's fused=True; under --deepspeed the client optimizer the engine steps). "
               "Default: on for CUDA, off on CPU",
            off="torch's default AdamW")
    _switch(f, "auto_micro_batch",
            on="two probe micro-batches measure GPU memory and pick the largest --packing_tokens that fits "
               "--auto_memory_fraction of the GPU, turning gradient checkpointing on if not even one "
               "--model_max_length record fits without it, or if rows would be shorter than 8,192 tokens without it "
               "and checkpointing at least doubles them (under ZeRO-3 a micro-batch's gathers cost the same however "
               "short its row). Default: on for CUDA with packing, unless --packing_tokens is "
               "given; it never turns checkpointing off when --gradient_checkpointing is given",
            off="no memory probe: --packing_tokens (or its default) and --gradient_checkpointing as given")
    _switch(f, "lora_input_cast",
            on="let peft cast each adapter's input to the adapter dtype (fp32) before its dropout, as peft "
               "does by default. Default: off on CUDA under --bf16/--fp16 without --deepspeed, where autocast "
               "casts the dropped input straight back to half precision for the matmul: the dropout then runs "
               "on the half-precision input (ATen computes it in fp32 and rounds once, the same values) with "
               "half the memory traffic; on elsewhere",
            off="adapter inputs stay in the compute dtype (see --lora_input_cast)")
    _switch(f, "fused_lora_dropout",
            on="LoRA: each adapter's dropout drawn inside the Triton kernel of its first matmul (lora_A) "
               "and drawn again in its backward, instead of a dropout kernel and a saved mask and dropped copy per "
               "adapter. Same drop probability and scaling, masks from another generator. Needs CUDA and "
               "Triton; not with --deepspeed. It keeps less activation memory a token (longer packed rows, or no "
               "gradient checkpointing) at the same speed. Default: off",
            off="peft's own dropout module in front of each adapter")
    f.add_argument("--attention_kernel", choices=["auto", "flash", "cudnn"],
                   help="the varlen attention of packed rows on CUDA: flash (PyTorch's FlashAttention 2) or cudnn "
                   "(cuDNN's fused attention, the faster of the two; needs the nvidia-cudnn-frontend package and a "
                   "Hopper or newer GPU). Default auto: cudnn where both are "
                   "there and the frontend's backward plans can be sized for the widest row, else flash")
    _switch(f, "labelled_logits_only",
            on="run the LM head and the loss only at the positions of a packed row whose next token is "
               "supervised: a prompt's tokens need no logits, and the LM head is the widest matmul of the model. "
               "The loss and its gradients are the same. Default: on with packing and a fused loss (liger or "
               "chunked); off with --fused_ce off, whose full logits are the reference",
            off="the LM head on every position of the row (unsupervised ones are masked out of the loss)")
    _switch(f, "overlap_steps",
            on="queue the next optimizer step on the GPU before reading this step's loss and gradient norm "
               "back, so the GPU never waits for the host between steps (a step's metrics record is written "
               "once the next step is under way; the last step, evaluations, checkpoints and a profiled step "
               "still wait). Default: on for CUDA, off on CPU (where every operation waits anyway)",
            off="read each step's loss and gradient norm back before the next step starts")
    _switch(f, "expandable_segments",
            on="PyTorch's expandable CUDA memory segments (PYTORCH_CUDA_ALLOC_CONF expandable_segments:True): "
               "packed rows change width every micro-batch, and near the memory limit the default allocator "
               "then frees its cache and retries, a device-wide synchronisation each time. Default: on for "
               "CUDA, unless PYTORCH_CUDA_ALLOC_CONF already sets expandable_segments",
            off="PyTorch's default CUDA allocator segments")
    f.add_argument("--auto_memory_fraction", type=float,
                   help="share of the GPU's memory --auto_micro_batch plans for (default 0.85)")
    f.add_argument("--auto_max_tokens", type=int,
                   help="largest packed row --auto_micro_batch may pick (default 65536)")

    lo = p.add_argument_group("LoRA / Q-LoRA")
    add_bool(lo, "use_lora", help="train LoRA adapters (peft) instead of all weights")
    add_bool(lo, "q_lora",
                    help="Q-LoRA: LoRA on a 4-bit nf4 base (bitsandbytes) or on an already GPTQ/AWQ-quantized checkpoint; implies --use_lora")
    lo.add_argument("--lora_r", type=int, help="LoRA rank (default 64)")
    lo.add_argument("--lora_alpha", type=int, help="LoRA alpha (default 16)")
    lo.add_argument("--lora_dropout", type=float, help="LoRA dropout (default 0.05)")
    lo.add_argument("--lora_target_modules", nargs="+", metavar="NAMES",
                    help="module names to adapt, comma- or space-separated (Qwen's finetune.py takes a list) "
                    f"(default: every decoder projection, {DEFAULT_LORA_TARGETS})")
    add_bool(lo, "merge_lora", help="after a LoRA run also save the merged full model in OUTPUT_DIR/merged")

    pref = p.add_argument_group("preference training (DPO)")
    pref.add_argument("--stage", choices=["sft", "dpo"],
                      help="sft: supervised fine-tuning on chat records (default); dpo: direct preference "
                      "optimisation on pairs of a chosen and a rejected answer, against the model as it is at the "
                      "start (its log-probabilities computed once before the first step: with LoRA the base with "
                      "the adapters disabled, no second copy of the model)")
    pref.add_argument("--pref_beta", type=float,
                      help="DPO's beta (TRL's beta): how far the policy may move from the reference (default 0.1)")
    pref.add_argument("--pref_loss", choices=["sigmoid", "ipo"],
                      help="sigmoid: DPO's loss (default); ipo: IPO's, on per-token averaged log-probabilities "
                      "(TRL's loss_type)")
    pref.add_argument("--pref_ftx", type=float,
                      help="weight of an SFT term on the chosen answer added to the loss (TRL's rpo_alpha; default "
                      "0: off)")

    moe = p.add_argument_group("mixture of experts (Qwen3-MoE, Qwen2-MoE)")
    moe.add_argument("--router_aux_loss_coef", type=float, metavar="COEF",
                     help="weight of the routers' load-balancing loss added to the cross-entropy on every path "
                     "(logged as aux_loss in metrics.jsonl); 0 leaves it out. Default: the model config's "
                     "router_aux_loss_coef (0.001 in Qwen's releases)")
    moe.add_argument("--experts_implementation", choices=("auto", "lean", "grouped_mm", "eager"),
                     help="the kernel of the fused experts (transformers 5): lean (grouped matmuls, less kept for "
                     "the backward), grouped_mm (transformers' grouped matmuls) or eager (a loop over the experts). "
                     "Default auto: lean on CUDA where torch has a grouped matmul, eager elsewhere")
    add_bool(moe, "train_router",
             help="train the routers (each sparse MoE block's gate): with LoRA they are saved with the adapter "
             "(peft modules_to_save). Default: the routers stay frozen, whatever the method")
    add_hf_flags(p)
    _take_defaults(p)
    return p


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
    if not d.data_path and not d.datasets:
        raise InputError("give --data_path (one source) or --datasets (several mixed)")
    if d.data_path and d.datasets:
        raise InputError("--data_path and --datasets both name the data: give one")
    check_pref(flags)


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
