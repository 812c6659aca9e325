"""Qwen's published fine-tuning commands run against the worker as they are written.

The three command lines are copied from QwenLM/Qwen finetune/finetune_ds.sh (full), finetune_lora_ds.sh
(LoRA) and finetune_qlora_ds.sh (Q-LoRA); only the shell variables are filled in, `finetune.py` is the
worker's module and `finetune/ds_config_zero2.json` its own ZeRO-2 config. HF spells booleans `--x True`,
which the worker parsed as an unknown positional until it learnt HF's spellings.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT
from support.ports import free_port
from support.worker import Run, assert_ok, one_process_threads
from training.args import parse_args

FULL = """torchrun $DISTRIBUTED_ARGS finetune.py \\
    --model_name_or_path $MODEL \\
    --data_path $DATA \\
    --bf16 True \\
    --output_dir output_qwen \\
    --num_train_epochs 5 \\
    --per_device_train_batch_size 1 \\
    --per_device_eval_batch_size 1 \\
    --gradient_accumulation_steps 16 \\
    --evaluation_strategy "no" \\
    --save_strategy "steps" \\
    --save_steps 1000 \\
    --save_total_limit 10 \\
    --learning_rate 1e-5 \\
    --weight_decay 0.1 \\
    --adam_beta2 0.95 \\
    --warmup_ratio 0.01 \\
    --lr_scheduler_type "cosine" \\
    --logging_steps 1 \\
    --report_to "none" \\
    --model_max_length 512 \\
    --gradient_checkpointing True \\
    --lazy_preprocess True \\
    --deepspeed finetune/ds_config_zero2.json
"""

LORA = """torchrun $DISTRIBUTED_ARGS finetune.py \\
    --model_name_or_path $MODEL \\
    --data_path $DATA \\
    --bf16 True \\
    --output_dir output_qwen \\
    --num_train_epochs 5 \\
    --per_device_train_batch_size 2 \\
    --per_device_eval_batch_size 1 \\
    --gradient_accumulation_steps 8 \\
    --evaluation_strategy "no" \\
    --save_strategy "steps" \\
    --save_steps 1000 \\
    --save_total_limit 10 \\
    --learning_rate 3e-4 \\
    --weight_decay 0.1 \\
    --adam_beta2 0.95 \\
    --warmup_ratio 0.01 \\
    --lr_scheduler_type "cosine" \\
    --logging_steps 1 \\
    --report_to "none" \\
    --model_max_length 512 \\
    --lazy_preprocess True \\
    --use_lora \\
    --gradient_checkpointing \\
    --deepspeed finetune/ds_config_zero2.json
"""

QLORA = """torchrun $DISTRIBUTED_ARGS finetune.py \\
    --model_name_or_path $MODEL \\
    --data_path $DATA \\
    --fp16 True \\
    --output_dir output_qwen \\
    --num_train_epochs 5 \\
    --per_device_train_batch_size 2 \\
    --per_device_eval_batch_size 1 \\
    --gradient_accumulation_steps 8 \\
    --evaluation_strategy "no" \\
    --save_strategy "steps" \\
    --save_steps 1000 \\
    --save_total_limit 10 \\
    --learning_rate 1e-5 \\
    --weight_decay 0.1 \\
    --adam_beta2 0.95 \\
    --warmup_ratio 0.01 \\
    --lr_scheduler_type "cosine" \\
    --logging_steps 1 \\
    --report_to "none" \\
    --model_max_length 512 \\
    --lazy_preprocess True \\
    --use_lora \\
    --q_lora \\
    --gradient_checkpointing \\
    --deepspeed finetune/ds_config_zero2.json"""

COMMANDS = {"full": FULL, "lora": LORA, "qlora": QLORA}


def worker_argv(command: str, model: str, out: Path) -> list[str]:
    """The worker's flags of a published command: what follows `finetune.py`, with its variables filled in."""
    text = (command.replace("$MODEL", model).replace("$DATA", "builtin:demo-chat")
            .replace("output_qwen", str(out)).replace("finetune/ds_config_zero2.json",
                                                      str(ROOT / "training" / "ds_config_zero2.json")))
    words = shlex.split(text.replace("\\\n", " "))  # the shell's line continuations
    return words[words.index("finetune.py") + 1:]


@pytest.mark.parametrize("name", COMMANDS)
def test_qwen_command_parses_with_hf_meanings(name, tmp_path):
    args = parse_args(worker_argv(COMMANDS[name], "builtin:tiny", tmp_path / "out"))
    assert args.notes.hf_warnings == []  # every flag Qwen passes has its meaning here
    assert (args.train.bf16, args.train.fp16) == ((False, True) if name == "qlora" else (True, False))
    assert args.data.lazy_preprocess is True and args.train.gradient_checkpointing is True
    assert args.lora.use_lora is (name != "full") and args.lora.q_lora is (name == "qlora")
    assert args.hf.eval_strategy == "no" and args.save.eval_steps == 0
    assert args.train.lr_scheduler_type == "cosine" and args.train.adam_beta2 == 0.95
    assert args.save.save_total_limit == 10
    assert args.train.deepspeed.endswith("ds_config_zero2.json") and args.data.model_max_length == 512
    assert args.fast.packing is None  # not given: the fast path still decides


def test_hf_boolean_spellings_and_their_negations():
    base = ["--model_name_or_path", "m", "--data_path", "d", "--output_dir", "o"]
    assert parse_args(base + ["--use_lora"]).lora.use_lora is True
    assert parse_args(base + ["--use_lora", "True"]).lora.use_lora is True
    assert parse_args(base + ["--use_lora", "False"]).lora.use_lora is False
    assert parse_args(base + ["--use_lora=yes"]).lora.use_lora is True
    assert parse_args(base + ["--use_lora", "--no_use_lora"]).lora.use_lora is False  # the last one wins, as in HF
    assert parse_args(base + ["--packing", "False"]).fast.packing is False  # a fast-path switch, stated
    assert parse_args(base + ["--no_packing"]).fast.packing is False
    assert parse_args(base + ["--compile", "true"]).fast.compile is True
    assert parse_args(base + ["--gradient_checkpointing", "0"]).train.gradient_checkpointing is False


def test_hf_flags_without_effect_warn_and_mapped_ones_take_effect():
    base = ["--model_name_or_path", "m", "--data_path", "d", "--output_dir", "o"]
    args = parse_args(base + ["--report_to", "wandb", "--optim", "adafactor", "--run_name", "x", "--do_train",
                              "--eval_strategy", "epoch", "--logging_strategy", "steps"])
    joined = "\n".join(args.notes.hf_warnings)
    for flag in ("--optim adafactor", "--do_train", "--logging_strategy"):
        assert flag in joined, joined
    assert len(args.notes.hf_warnings) == 3  # --report_to, --run_name and --eval_strategy epoch take effect
    assert args.hf.report_to == ["wandb"] and args.hf.run_name == "x" and args.hf.eval_strategy == "epoch"
    args = parse_args(base + ["--eval_strategy", "steps", "--logging_steps", "5", "--optim", "adamw_torch_fused",
                              "--warmup_steps", "3", "--max_steps", "7", "--lora_target_modules", "q_proj", "v_proj"])
    assert args.notes.hf_warnings == [] and args.save.eval_steps == 5 and args.fast.fused_adamw is True
    assert args.lora.lora_target_modules == ["q_proj", "v_proj"]
    import math

    assert math.ceil(args.train.warmup_ratio * 7) == 3  # the recipe's own rounding gives exactly 3 warm-up steps


def test_hf_flag_errors_exit_2_naming_the_flag(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cases = [(["--bf16", "maybe"], "--bf16"), (["--bf16", "True", "--fp16", "True"], "--bf16 and --fp16"),
             (["--eval_strategy", "sometimes"], "--eval_strategy")]
    for extra, needle in cases:
        res = subprocess.run([sys.executable, "-m", "training.finetune", "--model_name_or_path", "m", "--data_path",
                              "d", "--output_dir", str(tmp_path / "out"), *extra], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and needle in res.stderr, (extra, res.stderr)
        assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", COMMANDS)
def test_qwen_command_trains_the_tiny_model(name, tmp_path, tiny_model):
    """The command as published under torchrun, cut to a few steps (`--max_steps`, appended: the last flag wins).
    Q-LoRA's `--fp16 True` needs CUDA (Qwen chose it for auto-gptq), so on CPU it is turned around the HF way."""
    out = tmp_path / "out"
    extra = ["--max_steps", "4"] + (["--fp16", "False", "--bf16", "True"] if name == "qlora" else [])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--nnodes", "1", "--node_rank",
           "0", "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "training.finetune",
           *worker_argv(COMMANDS[name], str(tiny_model), out), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": one_process_threads()}
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    run = Run(res.returncode, res.stdout, res.stderr, out)
    assert_ok(run)
    start = run.records[0]
    assert start["method"] == name and start["zero_stage"] == 2 and start["precision"] == "bf16"
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4]
    assert all(r["loss"] > 0 for r in run.steps)
    saved = "adapter_model.safetensors" if name != "full" else "model.safetensors"
    assert (out / saved).is_file()
    assert "has no effect" not in res.stderr  # nothing of Qwen's command was ignored
