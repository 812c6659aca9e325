"""The demo preset replayed for real, as users run it (`qwen-tui replay` in a subprocess), with a few training
fields changed; and the one such run that several tests read (the `demo_eval_run` fixture, tests/launch/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from support.paths import DEMO, ROOT
from support.ports import free_port


def qwen_tui(*args: str, cwd: Path, timeout: float = 600, input: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "qwen_tui.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env, input=input)


def demo_run(tmp: Path, **training) -> Path:
    """The demo preset on a free port, `training` changed, replayed for real; returns its run directory (replay's
    output in replay.out beside runs/)."""
    data = yaml.safe_load(DEMO.read_text())
    data["network"]["master_port"] = free_port()
    data["training"].update({"output_dir": str(tmp / "out"), **training})
    preset = tmp / "demo.yaml"
    preset.write_text(yaml.safe_dump(data))
    res = qwen_tui("replay", str(preset), "--runs-dir", str(tmp / "runs"), cwd=tmp)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = [d for d in (tmp / "runs").iterdir() if d.is_dir()]
    (tmp / "replay.out").write_text(res.stdout)
    return run


# The demo's own training, plus the eval data every EVAL_STEPS: one run for the demo's end-to-end test and for
# chat and merge after it. test_wheel.py runs the demo unchanged, from the installed wheel.
EVAL_STEPS = 20
