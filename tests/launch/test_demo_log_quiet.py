"""The demo's log holds the run, not library noise (bitsandbytes' missing-`kernels` warning, transformers'
FutureWarning on every launch, DeepSpeed's "Setting accelerator to CPU"), and its caches (the tiny model, the
tokenized data) follow XDG_CACHE_HOME when QWEN_TUI_CACHE is not set; every file of its run directory is 0600."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from support.paths import DEMO, ROOT
from support.ports import free_port

NOISE = ("kernels-community", "FutureWarning", "is_gradient_checkpointing", "Setting accelerator to CPU",
         "warnings.warn(")


@pytest.mark.slow
def test_the_demos_log_is_free_of_library_noise_and_its_caches_follow_xdg(tmp_path):
    data = yaml.safe_load(DEMO.read_text())
    data["network"]["master_port"] = free_port()
    data["training"].update(output_dir=str(tmp_path / "out"), max_steps=10, save_steps=10)
    p = tmp_path / "demo.yaml"
    p.write_text(yaml.safe_dump(data))
    xdg = tmp_path / "xdg-cache"
    env = {k: v for k, v in os.environ.items() if k not in ("QWEN_TUI_CACHE", "QWEN_TUI_TOKENIZED_CACHE")}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="200", XDG_CACHE_HOME=str(xdg), HOME=str(tmp_path / "home"))
    res = subprocess.run([sys.executable, "-m", "qwen_tui", "replay", str(p), "--runs-dir", str(tmp_path / "runs")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=400, env=env)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    (rd,) = (tmp_path / "runs").iterdir()
    for log in sorted(rd.glob("node-*.log")):
        text = log.read_text()
        assert "tokenized cache" in text or "step" in text  # the log is the worker's
        noisy = [ln for ln in text.splitlines() if any(n in ln for n in NOISE)]
        assert not noisy, f"{log.name}:\n" + "\n".join(noisy)
    assert (xdg / "qwen-tui" / "tiny-qwen2" / "config.json").is_file()
    assert any((xdg / "qwen-tui" / "tokenized").iterdir())
    assert not (tmp_path / "home" / ".cache" / "qwen-tui").exists()
    # the README's promise: run directories 0700, their files 0600 (metrics.jsonl was 0644)
    for f in [rd, *rd.rglob("*")]:
        assert f.stat().st_mode & 0o077 == 0, f"{f}: {oct(f.stat().st_mode)}"
