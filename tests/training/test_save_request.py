"""SIGUSR2 asks the worker for a checkpoint and a quiet stop (SLURM's time-limit warning, relayed by qwen-tui):
sent to one rank only, every rank learns of it through the step's own all-reduce and they save the same step
together, then end with exit 0 and an end record that says stopped and why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from support.paths import ROOT
from support.ports import free_port
from support.worker import demo_records, write_jsonl

pytestmark = pytest.mark.slow


def _beat(hb, rank: int):
    try:
        return json.loads((hb / f"rank-{rank}.json").read_text())
    except (FileNotFoundError, ValueError):
        return None  # not written yet, or being replaced


def test_sigusr2_to_one_rank_saves_one_checkpoint_on_every_rank_and_stops(tmp_path, tiny_model):
    data = write_jsonl(tmp_path / "chat.jsonl", demo_records())
    out, hb = tmp_path / "out", tmp_path / "hb"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "training.finetune",
           "--model_name_or_path", str(tiny_model), "--data_path", str(data), "--output_dir", str(out),
           "--use_cpu", "--use_lora", "--lora_r", "8", "--max_steps", "2000", "--save_strategy", "steps",
           "--save_steps", "1000", "--logging_steps", "1", "--tokenized_cache_dir", "none",
           "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--model_max_length", "64",
           "--heartbeat_dir", str(hb), "--heartbeat_interval", "0.05"]
    log = tmp_path / "torchrun.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                                stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not ((b0 := _beat(hb, 0)) and (b1 := _beat(hb, 1)) and min(b0["step"], b1["step"]) >= 3):
            assert proc.poll() is None, f"the run ended before step 3:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, "no step 3 within 300 s"
            time.sleep(0.02)
        asked_at = b1["step"]
        os.kill(b1["pid"], signal.SIGUSR2)  # rank 1 alone: rank 0 must learn of it from the all-reduce
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert rc == 0, text[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    end = records[-1]
    assert end["event"] == "end" and end["status"] == "stopped" and "SIGUSR2" in end["reason"], end
    saved = [r for r in records if r.get("event") == "checkpoint"]
    assert [r["step"] for r in saved] == [end["step"]], saved  # one checkpoint, at the step training stopped
    assert asked_at <= end["step"] <= asked_at + 3, (asked_at, end["step"])  # at once, not at the run's end
    assert end["step"] < 1000
    ckpt = out / f"checkpoint-{end['step']}"
    assert (ckpt / "adapter_model.safetensors").exists() or any(ckpt.glob("*.safetensors")), sorted(ckpt.iterdir())
    said = [ln for ln in text.splitlines() if "saved as asked (SIGUSR2" in ln]
    assert {"[rank 0]" in ln for ln in said} == {True, False}, said  # both ranks stopped there, each said so
    assert "Traceback" not in text and "ChildFailedError" not in text, text[-4000:]
