"""The login user's runtime (support/login_runtime.py) from a checkout in a 0700 directory, as root clones into
/root: the user cannot read the checkout, so the tests that run qwen-tui as that user (test_field_faults.py) must
give it a runtime of its own, and must not open root's directories to do it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from support.login_runtime import build
from support.login_user import UID
from support.paths import ROOT


def as_user(argv: list[str], home: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", *argv], cwd=home,
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home), "COLUMNS": "100", **env})


def test_a_login_user_runs_qwen_tui_from_a_checkout_it_cannot_read():
    base = Path(tempfile.mkdtemp(prefix="qt-runtime-"))  # not pytest's tmp_path: that is root's only
    try:
        private = base / "private"  # where root cloned: other users may not enter
        private.mkdir(mode=0o700)
        repo = private / "qwen-tui"
        for name in ("qwen_tui", "training", "presets"):
            shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        os.chmod(base, 0o755)
        home = base / "home"
        home.mkdir()
        os.chown(home, UID, UID)

        # as the tests ran it before: the checkout on PYTHONPATH is out of the user's reach (the import finds no
        # qwen_tui there; this machine's own install may still answer from elsewhere, but not with that copy)
        naive = as_user([sys.executable, "-c", f"import qwen_tui; assert qwen_tui.__file__.startswith({str(repo)!r})"],
                        home, PYTHONPATH=str(repo))
        assert naive.returncode != 0, naive.stdout

        python = build(base / "runtime", UID, repo)
        res = as_user([str(python), "-c", "import qwen_tui, training, torch, transformers, peft; "
                       "print(qwen_tui.__file__); print(training.__file__)"], home)
        assert res.returncode == 0, res.stderr[-3000:]
        assert all(line.startswith(str(base / "runtime")) for line in res.stdout.split()), res.stdout
        # the commands work as installed: the shipped demo preset found inside the package
        demo = as_user([str(python), "-m", "qwen_tui.cli", "demo", "--dry-run", "--runs-dir", str(home / "runs")],
                       home)
        assert demo.returncode == 0 and "training.finetune" in demo.stdout, demo.stdout[-2000:] + demo.stderr[-2000:]
        # and nothing was opened to the user: root's directory keeps its mode
        assert (private.stat().st_mode & 0o777) == 0o700
        assert as_user(["ls", str(private)], home).returncode != 0
    finally:
        shutil.rmtree(base, ignore_errors=True)
