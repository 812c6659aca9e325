"""Probe and network checks on the namespace cluster."""

from __future__ import annotations

import sys

import pytest

from qwen_tui.nodes.checks.runner import run_checks
from qwen_tui.nodes.connect import close_all, connect_all


@pytest.fixture
def conns(preset):
    c = connect_all(preset)
    assert c.ok, c.errors_text()
    yield c
    close_all(c)


def test_probe_fills_facts_from_each_node(preset, cluster, conns):
    rep = run_checks(preset, dict(conns), network=False)
    assert rep.ok, [f.message for f in rep.errors]
    import torch
    for i, n in enumerate(cluster.nodes):
        f = rep.facts.nodes[i]
        assert f.hostname == n.hostname
        assert f.addresses["eth0"] == [n.addr]
        assert f.route_interface == "eth0"
        assert f.gpus == [] and f.gpu_count == 0  # CPU-only node, and it says so
        assert f.versions["torch"] == torch.__version__.split("+")[0] or f.versions["torch"] == torch.__version__
        assert f.training_importable is True
        assert f.python_version == ".".join(map(str, sys.version_info[:3]))
        assert f.disk_free_bytes > 0
    assert "qwen_tui" not in sys.modules.get("torch", sys).__name__


def test_firewall_drop_on_master_port_names_node_and_port(preset, cluster, conns):
    cluster.ns(2, "iptables", "-A", "OUTPUT", "-p", "tcp", "--dport", str(preset.network.master_port), "-j", "DROP")
    try:
        rep = run_checks(preset, dict(conns), bandwidth_seconds=1)
    finally:
        cluster.reset_firewall(2)
    bad = [f for f in rep.errors if f.code == "MASTER_PORT_UNREACHABLE"]
    assert [f.node for f in bad] == [2]
    assert "node2" in bad[0].message and str(preset.network.master_port) in bad[0].message
    assert rep.facts.links[2].port_reachable is False and rep.facts.links[1].port_reachable is True
    assert rep.facts.master_port_free is True
    assert any("29500" in r and "DROP" in r for r in rep.facts.links[2].firewall)
    assert rep.facts.links[1].firewall == []
    assert rep.verdict(2, "port") == "error" and rep.verdict(1, "port") == "ok"


def test_shaped_link_reports_bandwidth_and_warns_for_that_node_only(preset, cluster, conns):
    cluster.ns(1, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "2gbit", "burst", "1mb",
               "latency", "10ms")
    try:
        # the threshold sits between the shaped link (~2) and what unshaped veths give on 2 busy cores
        rep = run_checks(preset, dict(conns), warn_below_gbps=5.0)
    finally:
        cluster.reset_shaping(1)
    b1, b2 = rep.facts.links[1].bandwidth_gbps, rep.facts.links[2].bandwidth_gbps
    assert 1.0 < b1 < 2.3, b1
    assert b2 > 5.0, b2
    warned = [f.node for f in rep.findings if f.code == "LOW_BANDWIDTH"]
    assert warned == [1]
    said = [f.message for f in rep.findings if f.code in ("LOW_BANDWIDTH", "BANDWIDTH")]
    assert len(said) == 2 and all("over 4 streams" in m for m in said), said  # iperf3 -P 4, as iperf3 reported
    assert rep.facts.min_bandwidth_gbps() == b1
