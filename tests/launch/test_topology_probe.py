"""The real probe snippet, run here as on any node, with a stand-in `nvidia-smi` first on PATH that answers
the GPU query and prints real `topo -m` / `topo -p2p` output (tests/fixtures/nvidia-smi/topo): the matrix
must land in NodeFacts, survive facts.json, and drive the check's P2P warning. (No GPU here: the stand-in
is the only way to run the probe's nvidia-smi path.)"""

import json
import os
import stat
import sys
from pathlib import Path

from qwen_tui.cluster.facts import ClusterFacts
from qwen_tui.nodes.checks.probe import probe_node
from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.preset.schema import Preset

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi" / "topo"
QUERY = ("index, name, uuid, memory.total [MiB], driver_version\n"
         "0, NVIDIA GeForce RTX 5090, GPU-0000, 32607 MiB, 575.57.08\n"
         "1, NVIDIA GeForce RTX 5090, GPU-0001, 32607 MiB, 575.57.08\n")


def fake_smi(bindir: Path, topo: str, p2p: dict) -> None:
    """An nvidia-smi that answers what the probe asks; `topo`/`p2p` values are a fixture name, or
    "rc N" to fail that command with exit code N."""
    def answer(what: str) -> str:
        if what.startswith("rc "):
            return f'echo "nvidia-smi: this command is not supported" >&2; exit {what[3:]}'
        return f"cat '{FIX / what}'"

    log = bindir / "calls.log"
    (bindir / "query.csv").write_text(QUERY)
    script = f"""#!/bin/sh
echo "$*" >> '{log}'
case "$*" in
  --query-gpu=*) cat '{bindir / "query.csv"}' ;;
  --version) echo "NVIDIA-SMI version  : 575.57.08"; echo "CUDA Version        : 12.9" ;;
  "topo -m") {answer(topo)} ;;
  "topo -p2p r") {answer(p2p["r"])} ;;
  "topo -p2p w") {answer(p2p["w"])} ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""
    path = bindir / "nvidia-smi"
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def probe(tmp_path, monkeypatch, topo, p2p, **env):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_smi(bindir, topo, p2p)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    work = tmp_path / "work"
    work.mkdir()
    p = Preset.model_validate({
        "cluster": {"nodes": [{"host": "localhost", "gpus": 2, "workdir": str(work), "python": sys.executable}]},
        "network": {"env": env},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "output_dir": str(work / "out")}})
    facts, raw = probe_node(LocalTransport("node0"), p, 0, timeout=120)
    return p, facts, raw, (bindir / "calls.log").read_text().splitlines()


def test_probe_reads_the_matrix_and_p2p_into_node_facts(tmp_path, monkeypatch):
    p, f, raw, calls = probe(tmp_path, monkeypatch, "rtx5090-2x-phb.txt",
                             {"r": "rtx5090-2x-p2p-gns.txt", "w": "rtx5090-2x-p2p-gns.txt"})
    assert f.error is None and f.gpu_count == 2 and f.gpu_model == "NVIDIA GeForce RTX 5090"
    assert "topo -m" in calls and "topo -p2p r" in calls and "topo -p2p w" in calls
    t = f.topology
    assert t.gpus == 2 and t.links[0].link == "PHB" and (t.links[0].p2p_read, t.links[0].p2p_write) == ("GNS", "GNS")
    assert t.cpu_affinity == ["0-63", "0-63"] and f.topology_error is None
    # what `qwen-tui check --out` writes and `--facts` reads back
    back = ClusterFacts.from_dict(json.loads(json.dumps(ClusterFacts(nodes={0: f}).to_dict())))
    assert back.nodes[0].topology == t
    # the check's word on it: the warning and its fix
    from qwen_tui.nodes.checks.runner import consistency

    found = {x.code: x for x in consistency(p, ClusterFacts(nodes={0: f}))}
    assert found["GPU_TOPOLOGY"].message.startswith("localhost: 2 GPUs, PCIe (PHB), no P2P (GNS)")
    assert found["P2P_PCIE"].level == "warning" and "NCCL_P2P_LEVEL" in found["P2P_PCIE"].fix
    # once network.env chooses, the warning goes
    p2 = Preset.model_validate({**p.model_dump(exclude_unset=True), "network": {"env": {"NCCL_P2P_LEVEL": "NVL"}}})
    assert "P2P_PCIE" not in {x.code for x in consistency(p2, ClusterFacts(nodes={0: f}))}


def test_a_driver_without_topo_is_a_note_not_a_failure(tmp_path, monkeypatch):
    _, f, _, calls = probe(tmp_path, monkeypatch, "rc 3", {"r": "rc 2", "w": "rc 2"})
    assert f.error is None and f.gpu_count == 2  # the GPUs are known all the same
    assert f.topology is None and f.topology_error.startswith("nvidia-smi topo -m failed (rc 3)")
    assert not any(c.startswith("topo -p2p") for c in calls)  # no matrix: no P2P question


def test_p2p_unsupported_leaves_the_status_unknown(tmp_path, monkeypatch):
    _, f, _, _ = probe(tmp_path, monkeypatch, "rtx5090-2x-phb.txt", {"r": "rc 2", "w": "rtx5090-2x-p2p-ok.txt"})
    lk = f.topology.links[0]
    assert (lk.p2p_read, lk.p2p_write, lk.p2p_ok) == (None, "OK", True)


def test_one_gpu_asks_no_p2p(tmp_path, monkeypatch):
    _, f, _, calls = probe(tmp_path, monkeypatch, "tesla-p4-1x.txt", {"r": "rc 9", "w": "rc 9"})
    assert f.topology.gpus == 1 and f.topology.links == []
    assert not any(c.startswith("topo -p2p") for c in calls)
