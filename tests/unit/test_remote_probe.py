"""The probe and the manifest (qwen_tui/nodes/remote/probe.py, manifest.py, with digests.py; ib_sysfs.py has its
tests in test_infiniband.py), run as the nodes run them: `python3 -c PROGRAM ARGS` with the plain system
python3, in a workdir of their own, with an `ip` stand-in first on PATH and the digest cache in tmp_path."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qwen_tui.nodes.checks.probe import GPU_QUERY, TOOLS, VERSIONED, facts_from_json
from qwen_tui.nodes.programs import program
from qwen_tui.nodes.sync import SKIP_DIRS

NODE_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
IP_JSON = [{"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1"}]},
           {"ifname": "eth9", "addr_info": [{"family": "inet", "local": "10.9.0.5"}, {"family": "inet6", "local": "fe80::1"}]}]


@pytest.fixture
def node(tmp_path) -> dict:
    """A node's workdir with training code, a data file, a model directory, an `ip` that answers in JSON."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ip = bindir / "ip"
    ip.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(IP_JSON)}\nEOF\n")
    ip.chmod(0o755)
    work = tmp_path / "work"
    (work / "training").mkdir(parents=True)
    (work / "training" / "__init__.py").write_text("")
    (work / "training" / "finetune.py").write_text("")
    data = work / "data.jsonl"
    data.write_text('{"messages": []}\n')
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "w.bin").write_bytes(b"\0" * 1000)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "QWEN_TUI_CACHE": str(tmp_path / "cache")}
    return {"bin": bindir, "work": work, "data": data, "model": model, "env": env, "tmp": tmp_path}


def run_py(name: str, *args: str, env: dict, cwd: Path) -> dict:
    r = subprocess.run([NODE_PY, "-c", program(name), *args], capture_output=True, text=True, timeout=120,
                       env=env, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def probe(node: dict, **over) -> dict:
    args = {"master": "127.0.0.1", "tools": list(TOOLS), "gpu_query": GPU_QUERY, "versioned": list(VERSIONED),
            "output_dir": str(node["tmp"] / "out" / "not-yet"), "data": str(node["data"]),
            "model": str(node["model"]), "hub_model": None, "hf_env": {}, **over}
    return run_py("probe.py", json.dumps(args), env=node["env"], cwd=node["work"])


def tree_digest(root: Path) -> str:
    items = [[str(f.relative_to(root)), f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest()]
             for f in sorted(p for p in root.rglob("*") if p.is_file())]
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def test_the_probe_reports_the_node(node):
    raw = probe(node)
    assert raw["cwd"] == str(node["work"]) and raw["python"] and raw["cpu_count"] == os.cpu_count()
    assert raw["addresses"] == {"lo": ["127.0.0.1"], "eth9": ["10.9.0.5"]}  # IPv4 only
    assert (raw["route_src"], raw["route_interface"]) == ("127.0.0.1", "lo")
    assert raw["tools"]["ip"] == str(node["bin"] / "ip") and raw["tools"]["nvidia-smi"] is None
    assert "nvidia_smi" not in raw  # no nvidia-smi: none of its commands ran
    assert raw["training_importable"] is True
    assert raw["memory_total_mib"] > 0 and raw["disk_free_bytes"] > 0 and raw["open_files"] != 0
    assert len(raw["ephemeral_ports"]) == 2 and set(raw["versions"]) == set(VERSIONED)
    assert raw["data"] == {"path": str(node["data"]), "exists": True, "size_bytes": node["data"].stat().st_size,
                           "sha256": hashlib.sha256(node["data"].read_bytes()).hexdigest()}
    assert raw["model"] == {"path": str(node["model"]), "exists": True, "size_bytes": 1002,
                            "sha256": tree_digest(node["model"])}
    assert raw["digest_cache"] == {"computed": 3, "reused": 0, "error": None}
    facts = facts_from_json(raw)
    assert facts.route_interface == "lo" and facts.addresses["eth9"] == ["10.9.0.5"]


def test_the_probe_without_training_code_or_files_says_so(node):
    shutil.rmtree(node["work"] / "training")
    raw = probe(node, data=str(node["tmp"] / "absent.jsonl"), model=None)
    assert raw["training_importable"] is False and "training" in raw["training_error"]
    assert raw["data"] == {"path": str(node["tmp"] / "absent.jsonl"), "exists": False} and raw["model"] is None


def test_digests_are_reused_until_a_file_changes(node):
    first = probe(node)
    cache = json.loads((node["tmp"] / "cache" / "digests.json").read_text())
    assert set(cache) == {str(node["data"]), str(node["model"] / "config.json"), str(node["model"] / "sub" / "w.bin")}
    again = probe(node)
    assert again["digest_cache"] == {"computed": 0, "reused": 3, "error": None}
    assert (again["data"], again["model"]) == (first["data"], first["model"])
    (node["model"] / "sub" / "w.bin").write_bytes(b"\1" * 1000)  # same size, new content and mtime
    changed = probe(node)
    assert changed["digest_cache"]["computed"] == 1 and changed["model"]["sha256"] == tree_digest(node["model"])
    assert changed["model"]["sha256"] != first["model"]["sha256"]


def test_a_cache_that_cannot_be_written_costs_only_time(node):
    blocker = node["tmp"] / "a-file"
    blocker.write_text("")
    env = {**node["env"], "QWEN_TUI_CACHE": str(blocker / "cache")}
    raw = run_py("probe.py", json.dumps({"master": "127.0.0.1", "tools": [], "gpu_query": GPU_QUERY, "versioned": [],
                                         "output_dir": str(node["tmp"]), "data": str(node["data"]), "model": None}),
                 env=env, cwd=node["work"])
    assert raw["data"]["sha256"] == hashlib.sha256(node["data"].read_bytes()).hexdigest()
    assert raw["digest_cache"]["computed"] == 1 and raw["digest_cache"]["error"].startswith(str(blocker / "cache"))


def test_the_manifest_matches_the_probe_and_skips_what_sync_skips(node):
    raw = probe(node)
    man = run_py("manifest.py", str(node["model"]), json.dumps(SKIP_DIRS), env=node["env"], cwd=node["work"])
    assert (man["exists"], man["dir"], man["sha256"], man["size"]) == (True, True, raw["model"]["sha256"], 1002)
    assert man["files"] == [["config.json", 2, hashlib.sha256(b"{}").hexdigest()],
                            ["sub/w.bin", 1000, hashlib.sha256(b"\0" * 1000).hexdigest()]]
    for junk in ("__pycache__/m.cpython-311.pyc", ".git/HEAD", "sub/old.pyc"):
        (node["model"] / junk).parent.mkdir(parents=True, exist_ok=True)
        (node["model"] / junk).write_text("x")
    again = run_py("manifest.py", str(node["model"]), json.dumps(SKIP_DIRS), env=node["env"], cwd=node["work"])
    assert again["sha256"] == man["sha256"] and again["files"] == man["files"]
    one = run_py("manifest.py", str(node["data"]), "[]", env=node["env"], cwd=node["work"])
    assert one == {"path": str(node["data"]), "exists": True, "dir": False, "size": node["data"].stat().st_size,
                   "sha256": raw["data"]["sha256"]}
    assert run_py("manifest.py", "~/nothing-here", "[]", env=node["env"], cwd=node["work"]) == \
        {"path": str(node["tmp"] / "home" / "nothing-here"), "exists": False}
