"""The local demo's second stage, headless: the shipped DPO preset replayed (`qwen-tui replay`) on the demo's
SFT model, merged. The demo's SFT run is the session's (demo_eval_run); its adapter is merged here into a model
directory of this test's own (the shared run's own merge belongs to test_after_run.py), and the shipped DPO preset
runs on it with only its model, output directory and port changed: two torchrun agents, LoRA, the reference the
merged model with the adapters disabled, so the first step's loss is ln 2 and its margin 0."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from support.demo_run import qwen_tui
from support.paths import DEMO_DPO
from support.ports import free_port

pytestmark = pytest.mark.slow


def test_dpo_preset_replays_on_the_demos_merged_model(demo_eval_run, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = demo_eval_run.parent.parent / "out"
    base_dir = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(out)).merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    AutoTokenizer.from_pretrained(out).save_pretrained(tmp_path / "merged")

    data = yaml.safe_load(DEMO_DPO.read_text())
    data["network"]["master_port"] = free_port()
    data["training"].update({"model": str(tmp_path / "merged"), "output_dir": str(tmp_path / "dpo-out"),
                             "max_steps": 6, "logging_steps": 1, "save_steps": 6})
    preset = tmp_path / "dpo.yaml"
    preset.write_text(yaml.safe_dump(data))
    res = qwen_tui("replay", str(preset), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in recs if r.get("event") == "start")
    steps = [r for r in recs if "event" not in r]
    assert start["stage"] == "dpo" and start["world_size"] == 2 and start["method"] == "lora"
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5) and steps[0]["rewards_margin"] == pytest.approx(0)
    assert len(steps) == 6 and all("rewards_accuracy" in r for r in steps)
    assert (tmp_path / "dpo-out" / "adapter_model.safetensors").is_file()
