"""Shared pieces of the wizard tests: the local-demo preset copied with a free port,
and facts that stand for two H200 nodes on a slow measured link."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from procs import run_processes  # noqa: F401  (re-exported for the tests here)
from qwen_tui.cluster.facts import GPU, ClusterFacts, LinkFacts, NodeFacts

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "presets" / "local-demo.yaml"


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def demo_copy(tmp_path):
    def make(**training) -> Path:
        data = yaml.safe_load(DEMO.read_text())
        data["network"]["master_port"] = free_port()
        data["training"]["output_dir"] = str(tmp_path / "out")
        data["training"].update(training)
        p = tmp_path / "demo.yaml"
        p.write_text(yaml.safe_dump(data, sort_keys=False))
        return p
    return make


def slow_h200_facts(gbps: float = 2.0) -> ClusterFacts:
    h200 = [GPU(index=0, name="NVIDIA H200", memory_total_mib=143771)]
    return ClusterFacts(nodes={0: NodeFacts(hostname="node0", gpus=h200, route_interface="eth0",
                                            addresses={"eth0": ["10.0.0.1"]}),
                               1: NodeFacts(hostname="node1", gpus=h200, route_interface="eth0",
                                            addresses={"eth0": ["10.0.0.2"]})},
                        links={1: LinkFacts(port_reachable=True, bandwidth_gbps=gbps)}, master_port_free=True)


@pytest.fixture
def anyio_backend():
    # Pilot tests are async; anyio's pytest plugin runs them (no pytest-asyncio needed)
    return "asyncio"


@pytest.fixture
def stop_runs_after():
    """Safety net: whatever a failing test leaves running in these run roots is stopped."""
    roots: list[Path] = []
    yield roots.append
    import json

    from qwen_tui.nodes.transport import LocalTransport, stop_group

    for root in roots:
        for pids in Path(root).glob("*/pids.json"):
            for pid in json.loads(pids.read_text()).values():
                stop_group(LocalTransport(), int(pid), grace=5)
