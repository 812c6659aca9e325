"""`qwen-tui check` of the shipped demo (two nodes on this machine, CPU over gloo) says each thing once: no
LORA_BATCH_RANGE (the demo's batch is one LoRA recipes use), CPU_ONLY once for the one machine, and no
MEMLOCK_LIMITED (a CPU run over gloo pins no memory)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from support.paths import DEMO, ROOT
from support.ports import free_port


@pytest.mark.slow
def test_the_demos_check_says_each_thing_once_and_nothing_about_memlock(tmp_path):
    data = yaml.safe_load(DEMO.read_text())
    data["network"]["master_port"] = free_port()
    p = tmp_path / "demo.yaml"
    p.write_text(yaml.safe_dump(data))
    res = subprocess.run([sys.executable, "-m", "qwen_tui", "check", str(p), "--bandwidth-seconds", "1"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert out.count("CPU_ONLY") == 1, out[-3000:]
    assert "MEMLOCK_LIMITED" not in out and "LORA_BATCH_RANGE" not in out, out[-3000:]
