"""The Python a login user of the tests runs qwen-tui with, wherever the checkout and its environment live.

Cloned where root clones (a directory other users cannot enter, as /root is), the checkout, its virtual
environment and the interpreter under it are all out of a login user's reach, and the tests must not open root's
directories to it. So the user gets a runtime of its own under a directory it can read, as an installed package
would give it one:

- an interpreter of this Python's version that other users can execute (this one, where they can reach it; else
  the system's of the same version, whose compiled packages load alike);
- a virtual environment on it whose site-packages holds hard links to this environment's packages (no byte
  copied, no mode changed: the files are already world-readable, their directories were not), without this
  checkout's editable install;
- a copy of the checkout's qwen_tui and training, the shipped presets inside qwen_tui as a wheel carries them.

tests/cluster/test_login_runtime.py shows it from a checkout in a 0700 directory; support.field_run gives it to
every login-user run (tests/cluster/test_field_faults.py, bench/chaos_soak.py)."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from support.paths import ROOT

# What this checkout's own install put into site-packages: the runtime holds a copy of the code instead.
OWN = ("__editable__", "qwen_tui", "qwen-tui", "training")


def _runs_as(uid: int, python: str) -> bool:
    """Whether the user can start `python` and it is of this Python's version (compiled packages must load)."""
    want = "%d.%d" % sys.version_info[:2]
    try:
        res = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python, "-c",
                              "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    except OSError:
        return False
    return res.returncode == 0 and res.stdout.strip() == want


def _open_to_others(path: str) -> bool:
    """Whether any user may reach `path` (every directory above it searchable by others) and run it: read from the
    modes, since a process with root's capabilities would be let through regardless."""
    real = Path(os.path.realpath(path))
    if not real.is_file() or (real.stat().st_mode & 0o005) != 0o005:
        return False
    return all(d.stat().st_mode & 0o001 for d in real.parents)


def interpreter_for(uid: int) -> str:
    """An interpreter of this version the user can execute: this one where others can reach it, else the system's."""
    version = "%d.%d" % sys.version_info[:2]
    candidates = [os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
                  f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    for python in dict.fromkeys(candidates):
        if os.path.exists(python) and _open_to_others(python) and _runs_as(uid, python):
            return python
    raise AssertionError(f"no Python {version} that uid {uid} may execute among {candidates}: install the "
                         f"system's (apt-get install python{version}) or put this Python where others can read it")


def _link_tree(src: Path, dst: Path) -> None:
    """dst mirrors src: new directories (0755), files as hard links (a copy where src is on another disk)."""
    for d, dirs, files in os.walk(src):
        rel = os.path.relpath(d, src)
        if rel == ".":
            dirs[:] = [x for x in dirs if not x.startswith(OWN)]
            files = [x for x in files if not x.startswith(OWN)]
        target = dst / rel if rel != "." else dst
        target.mkdir(mode=0o755, parents=True, exist_ok=True)
        for name in files:
            s, t = os.path.join(d, name), target / name
            if t.exists() or t.is_symlink():
                continue
            if os.path.islink(s):
                os.symlink(os.readlink(s), t)
                continue
            try:
                os.link(s, t)
            except OSError:  # another filesystem, or links refused: a copy then
                shutil.copy2(s, t)


def build(dest: Path, uid: int, repo: Path = ROOT) -> Path:
    """The runtime under `dest` (which the user can reach); returns the Python the user runs."""
    dest.mkdir(mode=0o755, parents=True, exist_ok=True)
    venv = dest / "venv"
    subprocess.run([interpreter_for(uid), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120,
                   capture_output=True)
    python = venv / "bin" / "python"
    target = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                           "['purelib'])"], text=True, timeout=60).strip())
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    for sp in sorted(p for p in ours if os.path.isdir(p) and p.startswith(sys.prefix)):
        _link_tree(Path(sp), target)
    for pkg in ("qwen_tui", "training"):
        shutil.copytree(repo / pkg, target / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    presets = target / "qwen_tui" / "presets"  # where an installed qwen-tui finds them (qwen_tui.preset.shipped)
    presets.mkdir(mode=0o755, exist_ok=True)
    for p in sorted((repo / "presets").glob("*.yaml")):
        shutil.copy2(p, presets / p.name)
    for d, _, files in os.walk(dest):  # whatever the umask: readable, and searchable where a directory
        os.chmod(d, 0o755)
        for name in files:
            f = os.path.join(d, name)
            if not os.path.islink(f) and os.stat(f).st_nlink == 1:  # a copy of ours; links keep their own mode
                os.chmod(f, os.stat(f).st_mode | 0o444)
    return python
