"""No password in any file written by the runs, the checks, the key setup or
their logs. Named to run last in this directory, after every other cluster test
has written its files under the session's base temp dir."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from support.cluster import PASSWORD, REPO, preset_dict


def test_keys_cli_then_no_password_anywhere(cluster, sshdir, keyed, tmp_path, tmp_path_factory):
    p = tmp_path / "k.yaml"
    p.write_text(yaml.safe_dump(preset_dict(cluster, sshdir)))
    # the password once, on stdin (the non-tty path of `qwen-tui keys`)
    r = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "keys", str(p)], input=PASSWORD + "\n",
                       capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "key already there" in r.stdout and PASSWORD not in r.stdout + r.stderr

    needle = PASSWORD.encode()
    roots = [tmp_path_factory.getbasetemp(), REPO / ".qwen-tui", REPO / "runs"]
    scanned, hits = 0, []
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for name in files:
                path = os.path.join(dirpath, name)
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError:
                    continue
                scanned += 1
                if needle in data:
                    hits.append(path)
    assert scanned > 20  # node homes, sshd logs, run dirs, logs, known_hosts, presets, check results
    assert hits == []
