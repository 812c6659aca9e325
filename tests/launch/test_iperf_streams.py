"""iperf3 with parallel streams, for real between two local "nodes" (the namespace cluster's
test_shaped_link... does the same across network namespaces)."""

import shutil

import pytest

from qwen_tui.cluster.facts import ClusterFacts
from qwen_tui.nodes.checks.netcheck import check_bandwidth, iperf_pair
from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.preset.files import parse_preset
from support.ports import free_port

pytestmark = pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs the iperf3 program")

TWO_LOCAL = """\
version: 1
cluster:
  nodes:
  - {host: localhost}
  - {host: localhost}
training: {model: builtin:tiny, data: builtin:demo-chat, device: cpu, zero_stage: null}
"""


def test_iperf_pair_runs_the_streams_it_asks_for():
    server, client = LocalTransport("master"), LocalTransport("worker")
    gbps = iperf_pair(server, client, "127.0.0.1", seconds=1, port=free_port(), streams=3)
    assert gbps > 0.1  # loopback: iperf3 itself checked that 3 streams ran (num_streams in its JSON)


def test_check_bandwidth_says_how_many_streams_measured_the_link():
    preset = parse_preset(TWO_LOCAL)
    facts = ClusterFacts()
    found = check_bandwidth(preset, {0: LocalTransport("a"), 1: LocalTransport("b")}, facts, seconds=1, streams=2)
    assert [f.code for f in found] in (["BANDWIDTH"], ["LOW_BANDWIDTH"]), [f.message for f in found]
    assert "over 2 streams" in found[0].message and facts.links[1].bandwidth_gbps > 0
