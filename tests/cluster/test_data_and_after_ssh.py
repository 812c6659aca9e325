"""The data preview with a remote master: the work runs on node 0 over SSH (its Python, its workdir, its copy
of the data), and errors name the node. Merge and chat on a remote master follow the healthy replay of
test_cli_check.py, on that run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from support.cluster import REPO, preset_dict


def _cli(*args, timeout=300):
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "qwen_tui.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def _preset(cluster, sshdir, path, **training):
    d = preset_dict(cluster, sshdir, output_dir=str(path.parent / "out"), **training)
    d["cluster"]["shared_storage"] = True
    path.write_text(yaml.safe_dump(d))
    return path


def test_data_preview_runs_on_the_master_over_ssh(cluster, sshdir, keyed, tmp_path):
    p = _preset(cluster, sshdir, tmp_path / "d.yaml")  # model_max_length 64: many demo records are cut
    r = _cli("data", str(p), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["records"] == 400 and rep["truncated"] > 4 and rep["world_size"] == 3
    assert "DATA_TRUNCATED" in {a["code"] for a in rep["advice"]}

    bad = _preset(cluster, sshdir, tmp_path / "bad.yaml", data="no/such/file.jsonl")
    r = _cli("data", str(bad))
    assert r.returncode == 1
    assert "node 0 (node0)" in r.stderr and "no/such/file.jsonl: data file not found" in r.stderr

