"""`python -m training.tiny`, `builtin:tiny`, and the worker's --help."""

from __future__ import annotations

import os
import subprocess
import sys

from support.paths import ROOT
from training.args import build_parser

ISSUE_FLAGS = """--model_name_or_path --data_path --eval_data_path --output_dir --model_max_length
--per_device_train_batch_size --gradient_accumulation_steps --learning_rate --num_train_epochs --max_steps
--warmup_ratio --lr_scheduler_type --weight_decay --bf16 --fp16 --gradient_checkpointing --save_strategy
--save_steps --save_total_limit --logging_steps --seed --deepspeed --resume_from_checkpoint --use_lora --q_lora
--lora_r --lora_alpha --lora_dropout --lora_target_modules --lazy_preprocess --use_cpu --metrics_file
--merge_lora --save_on_each_node""".split()


def test_help_documents_every_flag():
    parser = build_parser()
    documented = {opt: a.help for a in parser._actions for opt in a.option_strings}
    for flag in ISSUE_FLAGS:
        assert documented.get(flag), f"{flag} is missing from --help or has no text"
    res = subprocess.run([sys.executable, "-m", "training.finetune", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and all(flag in res.stdout for flag in ISSUE_FLAGS)
    assert "exit codes" in res.stdout


def test_tiny_builds_deterministically_and_concurrently(tmp_path, tiny_model):
    """Two builders racing on one directory (two ranks on one node) both succeed; the bytes match the fixture's."""
    out = tmp_path / "cache" / "tiny-qwen2"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "training.tiny", str(out)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
    assert sorted(os.listdir(out.parent)) == ["tiny-qwen2"], "no temporary build directory may be left behind"
    names = sorted(os.listdir(tiny_model))
    assert sorted(os.listdir(out)) == names
    for name in names:
        assert (out / name).read_bytes() == (tiny_model / name).read_bytes(), name
    # idempotent: a second build leaves the existing model alone
    from training.model.tiny import build_tiny

    before = (out / "model.safetensors").stat().st_mtime_ns
    assert build_tiny(out) == out and (out / "model.safetensors").stat().st_mtime_ns == before


def test_tiny_loads_offline_with_auto_classes(tiny_model):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(tiny_model)
    assert cfg.model_type == "qwen2" and cfg.hidden_size == 64 and cfg.num_hidden_layers == 2
    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert ids == [len(tok) - 3, len(tok) - 2, len(tok) - 1] and len(tok) <= 1024
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= names
    text = tok.apply_chat_template([{"role": "user", "content": "héllo 你好"}], tokenize=False)
    assert text.startswith("<|im_start|>system\n") and tok.decode(tok(text)["input_ids"]) == text


def test_builtin_tiny_resolves_into_the_cache(tmp_path, monkeypatch):
    from training.model.pretrained import resolve_model_source

    monkeypatch.setenv("QWEN_TUI_CACHE", str(tmp_path))
    path = resolve_model_source("builtin:tiny", local_rank=0)
    assert path == str(tmp_path / "tiny-qwen2") and os.path.isfile(os.path.join(path, "config.json"))


def test_worker_never_imports_qwen_tui():
    """training/ runs on nodes that may not have the UI package: it talks back only through files."""
    code = ("import sys, training.finetune, training.recipe, training.model.tiny; "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'qwen_tui']; assert not bad, bad")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
