"""Bad input: exit code 2, one clear line naming the file/record/flag, nothing in the output directory."""

from __future__ import annotations

import json
import shutil

import pytest

from support.paths import ROOT
from support.worker import demo_records, run_worker, write_jsonl
from training.finetune import main

GOOD = demo_records(40)


def check_rejected(capsys, out, argv, *expected):
    rc = main(["--output_dir", str(out), *argv])
    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert rc == 2, err[-3000:]
    assert len(line) == 1, err[-3000:]
    for part in expected:
        assert part in line[0], line[0]
    assert not out.exists(), "nothing may be written to the output directory on bad input"
    return line[0]


@pytest.fixture
def good_data(tmp_path):
    return write_jsonl(tmp_path / "good.jsonl", GOOD)


def data_with(tmp_path, bad_line: str, at: int = 3):
    lines = [json.dumps(r, ensure_ascii=False) for r in GOOD]
    lines.insert(at, bad_line)
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


@pytest.mark.parametrize("bad_line,expected", [
    ('{"id": "broken", "conversations": [', ["bad.jsonl:4", "invalid JSON"]),
    ('{"id": "q-only", "conversations": [{"from": "user", "value": "hi"}]}', ["bad.jsonl:4", "record 3", "'q-only'", "no assistant turn"]),
    ('{"id": "who", "conversations": [{"from": "narrator", "value": "x"}, {"from": "assistant", "value": "y"}]}',
     ["record 3", "'who'", "unknown role 'narrator'"]),
    ('{"id": "void", "messages": []}', ["record 3", "'void'", "empty conversation"]),
], ids=["unreadable-json", "no-assistant", "unknown-role", "empty"])
def test_bad_training_data(tmp_path, capsys, tiny_model, bad_line, expected):
    data = data_with(tmp_path, bad_line)
    check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(tiny_model), "--data_path", str(data)],
                   str(data), *expected)


def test_bad_eval_data_is_named(tmp_path, capsys, tiny_model, good_data):
    bad = data_with(tmp_path, '{"id": "e1", "messages": [{"role": "user", "content": "x"}]}', at=0)
    check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(tiny_model), "--data_path", str(good_data),
                                              "--eval_data_path", str(bad)], str(bad), "'e1'", "no assistant turn")


def test_missing_data_file(tmp_path, capsys, tiny_model):
    check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(tiny_model), "--data_path",
                                              str(tmp_path / "nope.jsonl")], "nope.jsonl", "not found")


def test_model_dir_without_config(tmp_path, capsys, good_data, tiny_model):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "config.json").unlink()
    check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(model), "--data_path", str(good_data)],
                   str(model), "no config.json")


def test_model_dir_missing(tmp_path, capsys, good_data):
    check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(tmp_path / "no-model"),
                                              "--data_path", str(good_data)], "no-model", "not found")


def test_qlora_on_a_gptq_checkpoint_with_zero3(tmp_path, capsys, tiny_model, good_data):
    """ZeRO-3 shards a base quantized on load (tests/training/test_train.py); a GPTQ checkpoint's packed weights it
    cannot, and says so before anything loads."""
    model = tmp_path / "int4"
    shutil.copytree(tiny_model, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (model / "config.json").write_text(json.dumps(cfg))
    check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(model), "--data_path", str(good_data),
                                              "--q_lora", "--deepspeed", str(ROOT / "training" / "ds_config_zero3.json")],
                   "--q_lora on a GPTQ-quantized checkpoint does not work with ZeRO-3")


def test_qlora_on_a_gptq_checkpoint_without_gpu(tmp_path, capsys, tiny_model, good_data):
    model = tmp_path / "int4"
    shutil.copytree(tiny_model, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (model / "config.json").write_text(json.dumps(cfg))
    msg = check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(model), "--data_path", str(good_data),
                                                    "--q_lora"], "GPTQ")
    assert "needs" in msg
    # and full fine-tuning of an already quantized checkpoint is refused too
    check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(model), "--data_path", str(good_data)],
                   "gptq-quantized", "--q_lora")


def test_fp16_on_cpu(tmp_path, capsys, tiny_model, good_data):
    check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(tiny_model), "--data_path", str(good_data),
                                              "--q_lora", "--fp16", "--use_cpu"], "--fp16", "CUDA")


def test_deepspeed_config_that_does_not_parse(tmp_path, capsys, tiny_model, good_data):
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"zero_optimization": {"stage": 2,}\n}')
    check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(tiny_model), "--data_path", str(good_data),
                                              "--deepspeed", str(cfg)], str(cfg), "not valid JSON", "line 1")


def test_deepspeed_config_contradicting_the_flags(tmp_path, capsys, tiny_model, good_data):
    raw = json.loads((ROOT / "training" / "ds_config_zero2.json").read_text())
    raw["train_micro_batch_size_per_gpu"] = 4
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(raw))
    check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(tiny_model), "--data_path", str(good_data),
                                              "--deepspeed", str(cfg), "--per_device_train_batch_size", "2"],
                   "train_micro_batch_size_per_gpu", "auto")


def test_too_few_records_for_one_global_batch(tmp_path, capsys, tiny_model):
    data = write_jsonl(tmp_path / "small.jsonl", GOOD[:3])
    check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(tiny_model), "--data_path", str(data),
                                              "--per_device_train_batch_size", "4"], "3 usable records", "global batch")


def test_resume_from_a_missing_checkpoint(tmp_path, capsys, tiny_model, good_data):
    check_rejected(capsys, tmp_path / "out", ["--model_name_or_path", str(tiny_model), "--data_path", str(good_data),
                                              "--resume_from_checkpoint", str(tmp_path / "checkpoint-9")],
                   "checkpoint-9", "no such directory")


def test_exit_code_and_message_from_a_real_process(tmp_path, tiny_model):
    """The same path as users hit it: a subprocess, exit status 2, the error on stderr, no output dir."""
    data = data_with(tmp_path, '{"id": "who", "messages": [{"role": "bot", "content": "x"}]}')
    out = tmp_path / "out"
    run = run_worker(out, "--model_name_or_path", str(tiny_model), "--data_path", str(data), timeout=120)
    assert run.rc == 2, run.stderr[-3000:]
    assert f"error: {data}:4: record 3 (id 'who'): " in run.stderr
    assert not out.exists()
