"""A full fine-tune's saved model is what transformers and vLLM users expect: the dtype it trained in (bf16)
and use_cache true; a checkpoint keeps the exact fp32 weights to resume from, under its own state file name."""

from __future__ import annotations

import json
import shutil

import pytest

from support.worker import assert_ok, run_worker

pytestmark = pytest.mark.slow

FLAGS = ["--data_path", "builtin:demo-chat", "--bf16", "--max_steps", "4", "--save_steps", "2",
         "--model_max_length", "96", "--per_device_train_batch_size", "4", "--learning_rate", "1e-3",
         "--logging_steps", "1", "--seed", "3"]


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, tiny_model):
    run = run_worker(tmp_path_factory.mktemp("bf16") / "out", "--model_name_or_path", str(tiny_model), *FLAGS)
    assert_ok(run)
    return run


def tensor_dtypes(path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {str(f.get_slice(k).get_dtype()) for k in f.keys()}


def test_full_fine_tune_loads_in_bf16_with_use_cache(bf16_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = bf16_run.out
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["use_cache"] is True
    assert tensor_dtypes(out / "model.safetensors") == {"BF16"}
    model = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert model.dtype == torch.bfloat16 and model.config.use_cache is True
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("hello", return_tensors="pt").input_ids
    gen = model.generate(ids, max_new_tokens=4, do_sample=False)  # generation with the KV cache it asks for
    assert gen.shape[1] == ids.shape[1] + 4


def test_checkpoint_keeps_fp32_and_its_own_state_file(bf16_run):
    ckpt = bf16_run.out / "checkpoint-2"
    assert (ckpt / "finetune_state.json").is_file() and not (ckpt / "trainer_state.json").exists()
    assert tensor_dtypes(ckpt / "model.safetensors") == {"F32"}  # the weights exactly as they train
    assert json.loads((ckpt / "config.json").read_text())["use_cache"] is True


def test_checkpoint_with_the_old_state_file_name_still_resumes(bf16_run, tmp_path, tiny_model):
    """A checkpoint from before manifests (HF's state file name, no manifest.json): `auto` passes it over, saying
    why; named, it resumes, with a warning."""
    out = tmp_path / "out"
    shutil.copytree(bf16_run.out / "checkpoint-2", out / "checkpoint-2")
    (out / "checkpoint-2" / "finetune_state.json").rename(out / "checkpoint-2" / "trainer_state.json")
    (out / "checkpoint-2" / "manifest.json").unlink()
    from training.checkpoints import directories

    assert directories.complete_checkpoints(out) == []
    assert directories.skipped_lines(out)[0].startswith("checkpoint-2 is skipped: incomplete, no manifest.json")
    run = run_worker(out, "--model_name_or_path", str(tiny_model), *FLAGS,
                     "--resume_from_checkpoint", str(out / "checkpoint-2"))
    assert_ok(run)
    assert "no manifest.json" in run.stderr and "resuming from it as asked" in run.stderr
    assert run.records[0]["start_step"] == 2
    ref = bf16_run.losses()
    assert run.losses() == pytest.approx({s: ref[s] for s in (3, 4)}, rel=1e-5)
