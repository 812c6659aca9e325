"""The port check with some ports blocked on one node: every port it names was tried,
each probe has its own bound, so one dropped port does not use up the window for the rest."""

from __future__ import annotations

import re
import time

import pytest

from qwen_tui.cluster.facts import ClusterFacts
from qwen_tui.nodes.checks.netcheck import check_ports
from qwen_tui.nodes.connect import close_all, connect_all


@pytest.fixture
def conns(preset):
    c = connect_all(preset)
    assert c.ok, c.errors_text()
    yield c
    close_all(c)


def _facts(cluster) -> ClusterFacts:
    from qwen_tui.cluster.facts import NodeFacts

    f = ClusterFacts()
    for n in cluster.nodes:
        f.nodes[n.index] = NodeFacts(addresses={"eth0": [n.addr]}, route_interface="eth0")
    return f


def test_blocked_ports_on_one_node_are_each_tried_and_named(preset, cluster, conns):
    # node2 drops every new TCP connection except ssh: its sampled ephemeral ports all time out
    cluster.ns(2, "iptables", "-A", "INPUT", "-p", "tcp", "--syn", "!", "--dport", "22", "-j", "DROP")
    try:
        t0 = time.monotonic()
        findings = check_ports(preset, dict(conns), _facts(cluster), sample=3, seed=7)
        took = time.monotonic() - t0
    finally:
        cluster.reset_firewall(2)
    msgs = [f.message for f in findings]
    assert not any("not tried" in m for m in msgs), msgs
    blocked = {f.node: f.message for f in findings if f.code == "HIGH_PORTS_BLOCKED"}
    assert set(blocked) == {0, 1}, msgs  # node2 itself reaches the others
    for i in (0, 1):
        named = re.findall(r"node2:(\d+) \(timed out", blocked[i])
        assert len(named) == 3, blocked[i]  # all three of node2's ports tried, none on the others
        assert "node0:" not in blocked[i] and "node1:" not in blocked[i], blocked[i]
    assert took < 40, took


def test_healthy_cluster_ports_all_reachable_again_and_again(preset, cluster, conns):
    # the listeners are up before anyone connects: no stray finding on a healthy cluster
    for seed in range(3):
        findings = check_ports(preset, dict(conns), _facts(cluster), seed=seed)
        assert findings == [], [f.message for f in findings]
