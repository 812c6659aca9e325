"""`replay`/`demo` and an output directory that holds another run's work, with a real demo run's output: a second
launch into it is refused, naming the directory and the way to force; forced, the new run never rotates away the
other run's checkpoints (nor its own because of the other's higher steps); `resume_from_checkpoint: auto` says
what it resumes from, and which run saved it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.paths import DEMO, ROOT
from support.ports import free_port

pytestmark = pytest.mark.slow


def preset(tmp_path: Path, name: str, **training) -> Path:
    data = yaml.safe_load(DEMO.read_text())
    data["network"]["master_port"] = free_port()
    data["training"].update(output_dir=str(tmp_path / "out"), **training)
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def replay(tmp_path: Path, p: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qwen_tui", "replay", str(p), "--runs-dir", str(tmp_path / "runs"),
                           *extra], cwd=tmp_path, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"})


def state(ckpt: Path) -> dict:
    return json.loads((ckpt / "finetune_state.json").read_text())


def newest_run(tmp_path: Path) -> Path:
    return max((tmp_path / "runs").iterdir(), key=lambda d: d.stat().st_mtime)


def test_a_second_launch_into_a_used_output_dir_is_refused_and_forced_keeps_the_other_runs_checkpoints(tmp_path):
    out = tmp_path / "out"
    first = replay(tmp_path, preset(tmp_path, "first"))  # the shipped demo: 60 steps, checkpoints at 30 and 60
    assert first.returncode == 0, first.stdout[-3000:]
    first_run = newest_run(tmp_path).name
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-30", "checkpoint-60"]
    theirs = state(out / "checkpoint-60")
    assert theirs["run_id"] == first_run and theirs["lineage"]

    again = replay(tmp_path, preset(tmp_path, "first"))
    said = again.stdout + again.stderr
    assert again.returncode == 1, said[-3000:]
    assert f"{out} on node 0 already holds another run's checkpoints" in said and "checkpoint-60" in said
    assert "--overwrite-output" in said and "resume_from_checkpoint: auto" in said
    assert len(list((tmp_path / "runs").iterdir())) == 1  # nothing started

    # forced: 40 steps, a checkpoint every 10, two kept
    forced = replay(tmp_path, preset(tmp_path, "second", max_steps=40, save_steps=10), "--overwrite-output")
    assert forced.returncode == 0, forced.stdout[-3000:]
    second = newest_run(tmp_path)
    assert state(out / "checkpoint-60") == theirs  # the other run's newest checkpoint is untouched
    mine = {p.name for p in out.glob("checkpoint-*") if state(p)["run_id"] == second.name}
    assert mine == {"checkpoint-30", "checkpoint-40"}, mine  # its own newest two, not pushed out by step 60
    log = (second / "node-0.log").read_text()
    assert "deleted" not in log or "checkpoint-60" not in log.split("deleted", 1)[1].splitlines()[0]
    for ln in log.splitlines():
        if "deleted" in ln and "checkpoint-" in ln:
            gone = ln.split("deleted ", 1)[1].split()[0].rsplit("/", 1)[-1]
            assert gone in ("checkpoint-10", "checkpoint-20"), ln

    resumed = replay(tmp_path, preset(tmp_path, "third", max_steps=70, save_steps=10, resume_from_checkpoint="auto"))
    text = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, text[-3000:]
    assert (f"resume_from_checkpoint: auto resumes from {out / 'checkpoint-60'} (step 60, saved by run {first_run})"
            in text), text[-3000:]
    assert f"resuming from {out / 'checkpoint-60'} (step 60, saved by run {first_run})" in (
        newest_run(tmp_path) / "node-0.log").read_text()
