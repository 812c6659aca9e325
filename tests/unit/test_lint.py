"""ruff, configured in pyproject.toml's [tool.ruff], finds nothing in the repository: the README's test command
fails on what `.ci/run`'s `ruff check .` would."""

from __future__ import annotations

import subprocess
import sys

from support.paths import ROOT


def test_ruff_finds_nothing():
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_ruff_would_catch_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return missing\n")
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
                          str(bad)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "F821" in res.stdout
