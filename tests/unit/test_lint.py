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


def test_ruff_sorts_imports_and_keeps_one_annotation_style(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from __future__ import annotations\n\nimport sys\nimport os\nfrom typing import Optional\n\n\n"
                   "def f(x: Optional[int]) -> None:\n    print(os, sys, x)\n")
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                          "--config", str(ROOT / "pyproject.toml"), str(bad)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1 and "I001" in res.stdout and "UP045" in res.stdout, res.stdout


def test_mypy_finds_nothing_in_the_packages_it_checks(tmp_path):
    """mypy, configured in pyproject.toml's [tool.mypy] (the core's lower floors and the launch API), is clean; and
    with the same settings it refuses a wrong type (so a clean run means something)."""
    res = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "Success" in res.stdout, res.stdout[-4000:] + res.stderr[-2000:]
    bad = tmp_path / "bad.py"
    bad.write_text("from typing import Optional\n\n\ndef f(x: Optional[int]) -> int:\n    return x + 1\n")
    res = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--config-file",
                          str(ROOT / "pyproject.toml"), str(bad)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and "Unsupported operand" in res.stdout, res.stdout
