"""On one machine `replay` skips the node probe, but a missing data file or model is still an error before launch
(not "nothing to warn about", then a worker's failure); launched anyway, the failure names the worker's own error
line, and torchrun's "Root Cause ... error_file: <N/A>" report is not what the user reads (twice)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.paths import DEMO, ROOT
from support.ports import free_port
from support.procs import run_processes


def preset_with(tmp_path: Path, **training) -> Path:
    data = yaml.safe_load(DEMO.read_text())
    data["network"]["master_port"] = free_port()
    data["training"].update(output_dir=str(tmp_path / "out"), **training)
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def replay(tmp_path: Path, preset: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qwen_tui", "replay", str(preset), "--runs-dir",
                           str(tmp_path / "runs"), *extra], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})


@pytest.mark.parametrize("kind, value", [("data", "chats/december/missing.jsonl"), ("model", "/nonexistent/qwen-tiny")])
def test_a_missing_data_file_or_model_on_one_machine_refuses_to_launch(tmp_path, kind, value):
    res = replay(tmp_path, preset_with(tmp_path, **{kind: value}))
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert "nothing to warn about" not in out
    assert f"{kind.upper()}_MISSING" in out and value in out and "not launched" in out, out[-3000:]
    assert "copy it from the master" not in out  # there is no other copy: this machine is the master
    if kind == "data":
        assert str(tmp_path / value) in out  # where it was looked for, from the node's workdir
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing was started


@pytest.mark.slow
def test_launched_anyway_the_failure_shows_the_workers_error_once_without_torchruns_report(tmp_path):
    res = replay(tmp_path, preset_with(tmp_path, data=str(tmp_path / "missing.jsonl")), "--force")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert "data file not found" in out.split("failed:", 1)[-1].splitlines()[0], out[-3000:]  # on the failure line
    assert "Root Cause" not in out and "error_file" not in out, out[-3000:]
    assert out.count("missing.jsonl: data file not found") <= 2  # the failure line and its log line, not repeated
    (rd,) = (tmp_path / "runs").iterdir()
    assert run_processes(rd.name) == []
