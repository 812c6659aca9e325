"""`qwen-tui keys` with the password once on stdin (the non-tty path): keys already in place are left as they are
and the password is never echoed. No file on disk holds it either: tests/cluster/conftest.py scans every file
the cluster tests wrote after the last of them."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from support.cluster import PASSWORD, REPO, preset_dict


def test_keys_cli_takes_the_password_on_stdin_and_never_echoes_it(cluster, sshdir, keyed, tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text(yaml.safe_dump(preset_dict(cluster, sshdir)))
    r = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "keys", str(p)], input=PASSWORD + "\n",
                       capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "key already there" in r.stdout and PASSWORD not in r.stdout + r.stderr
