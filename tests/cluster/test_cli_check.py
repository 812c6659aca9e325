"""`qwen-tui check` and `qwen-tui replay` against the namespace cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import yaml

from support.cluster import REPO, preset_dict


def _write_preset(cluster, sshdir, path, **training):
    d = preset_dict(cluster, sshdir, output_dir=str(path.parent / "out"), **training)
    d["cluster"]["shared_storage"] = True
    path.write_text(yaml.safe_dump(d))
    return path


def _cli(*args, timeout=300):
    env = {**os.environ, "COLUMNS": "250"}  # one finding a line
    return subprocess.run([sys.executable, "-m", "qwen_tui.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def test_check_matrix_on_the_healthy_cluster_with_rehearsal(cluster, sshdir, keyed, tmp_path):
    p = _write_preset(cluster, sshdir, tmp_path / "c.yaml")
    out = tmp_path / "check.json"
    r = _cli("check", str(p), "--json", "--out", str(out), "--bandwidth-seconds", "1")
    data = json.loads(r.stdout)
    assert r.returncode == 0, [f for f in data["findings"] if f["level"] == "error"]
    assert data == json.loads(out.read_text())  # the same results, stored
    assert set(data["matrix"]) == {"node0", "node1", "node2"}
    for lab, row in data["matrix"].items():
        for col in ("ssh", "python", "code", "port", "nccl-ports", "rehearsal"):
            assert row[col] == "ok", (lab, col, row)
        assert row["gpu"] == "ok"  # CPU-only, as the preset (device: cpu) wants
    cpu_only = [f for f in data["findings"] if f["code"] == "CPU_ONLY"]
    assert sorted(f["node"] for f in cpu_only) == [0, 1, 2] and "CPU-only" in cpu_only[0]["message"]
    assert data["facts"]["rehearsal_ok"] is True
    assert data["facts"]["links"]["2"]["bandwidth_gbps"] > 0
    # the rehearsal's all-reduce bus bandwidth lands in the facts, and the estimate takes it from there and says so
    busbw = data["facts"]["rehearsal_bandwidth_gbps"]
    assert busbw > 0 and data["facts"]["rehearsal_size_mb"] == 32  # gloo's default message (CPU processes)
    r = _cli("estimate", str(p), "--facts", str(out), "--json")
    assert r.returncode == 0, r.stderr
    bw = json.loads(r.stdout)["bandwidth"]
    assert bw["source"] == "rehearsal" and bw["gbps"] == round(busbw, 3) and "at 32 MB" in bw["detail"]
    r = _cli("estimate", str(p), "--facts", str(out))
    assert r.returncode == 0, r.stderr
    assert f"between nodes {busbw:.4g} Gbit/s (rehearsal all-reduce bus bandwidth" in r.stdout, r.stdout


def test_firewall_drop_check_names_node_and_port_and_launch_refuses(cluster, sshdir, keyed, tmp_path):
    p = _write_preset(cluster, sshdir, tmp_path / "fw.yaml")
    port = "29500"
    cluster.ns(2, "iptables", "-A", "OUTPUT", "-p", "tcp", "--dport", port, "-j", "DROP")
    try:
        r = _cli("check", str(p), "--no-rehearsal", "--bandwidth-seconds", "1")
        assert r.returncode == 1
        line = next(ln for ln in r.stdout.splitlines() if "MASTER_PORT_UNREACHABLE" in ln)
        assert "node2" in line and port in line
        # per-node progress as each check finishes, before the matrix (27 s of silence before)
        head = r.stdout.split("qwen-tui check", 1)[0]
        for i in range(3):
            assert f"ssh       {i} node{i}" in head and f"probe     {i} node{i}" in head, head
        assert "port      2 node2          cannot reach the master port" in head, head
        assert "port      1 node1          reaches the master port" in head, head
        r = _cli("replay", str(p), "--runs-dir", str(tmp_path / "runs"), "--max-seconds", "60")
        assert r.returncode != 0
        assert "not launched" in r.stdout and "node 2" in r.stdout and port in r.stdout, r.stdout[-3000:]
        # replay shows each node's check outcome as it comes, before the verdict, as check does
        before = r.stdout.split("not launched", 1)[0]
        assert re.search(r"port: node 2 \(node2\): cannot reach the master port", before), before[-3000:]
        assert re.search(r"port: node 1 \(node1\): reaches the master port", before), before[-3000:]
        assert all(cluster.job_pids(i) == [] for i in range(len(cluster.nodes)))
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    finally:
        cluster.reset_firewall(2)


def test_replay_on_the_healthy_cluster_checks_rehearses_trains_and_stores_the_checks_then_merges_and_chats(
        cluster, sshdir, keyed, tmp_path):
    """The headless face end to end over SSH: checks and rehearsal pass, three nodes train,
    the loss falls, and the run directory holds the check matrix beside the plan. Then the merge and chat of
    that run run on its remote master (node 0's Python, workdir and copy of the model), as users follow a run."""
    p = _write_preset(cluster, sshdir, tmp_path / "r.yaml", max_steps=12, learning_rate=0.003, logging_steps=2,
                      eval_data="builtin:demo-chat")
    runs = tmp_path / "runs"
    r = _cli("replay", str(p), "--runs-dir", str(runs), "--max-seconds", "240")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "rehearsal: rendezvous and all-reduce" in r.stdout
    assert "last eval loss" in r.stdout
    import re
    first, last = map(float, re.search(r"loss ([0-9.]+) -> ([0-9.]+) over", r.stdout).groups())
    assert last < first, (first, last)
    (rd,) = [d for d in runs.iterdir() if d.is_dir()]
    check = json.loads((rd / "check.json").read_text())
    assert check["facts"]["rehearsal_ok"] is True
    assert {row["rehearsal"] for row in check["matrix"].values()} == {"ok"}
    facts = json.loads((rd / "facts.json").read_text())
    assert set(facts["nodes"]) == {"0", "1", "2"}
    plan = json.loads((rd / "plan.json").read_text())
    # the probe's route interface reached every node's gloo setting
    for c in plan["nodes"]:
        assert c["env"]["GLOO_SOCKET_IFNAME"] == facts["nodes"][str(c["rank"])]["route_interface"]
    assert all(cluster.job_pids(i) == [] for i in range(len(cluster.nodes)))
    assert json.loads((rd / "state.json").read_text())["status"] == "ok"

    # merge and chat with the remote master, on the run just finished
    r = _cli("merge", str(rd), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["merged_dir"] == str(tmp_path / "out" / "merged") and rep["check"]["relative_diff"] < 1e-4
    r = _cli("chat", str(rd), "--prompt", "-- hello?", "--max-new-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["model"] == str(tmp_path / "out" / "merged")
