"""The firewall as a login user (not root) sees it: iptables is not on such a user's
PATH and needs root to list the rules. A firewall that could not be read is "not
checked" with the reason, never "ok"; root reads the same rule."""

from __future__ import annotations

import pytest

from qwen_tui.cluster.facts import ClusterFacts
from qwen_tui.nodes.checks.netcheck import check_firewalls
from qwen_tui.nodes.checks.runner import run_checks
from qwen_tui.nodes.connect import close_all, connect_all
from support.login_user import LoginUser


@pytest.fixture
def login(cluster, sshdir, keyed):
    u = LoginUser(cluster, sshdir).add()
    yield u
    u.remove()


def test_a_login_users_unreadable_firewall_is_not_checked_with_the_reason(cluster, preset, login):
    port = str(preset.network.master_port)
    cluster.ns(1, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", port, "-j", "DROP")
    conns = connect_all(preset)
    t = login.transport(1)
    try:
        assert conns.ok, conns.errors_text()
        path = t.run(["sh", "-c", 'echo "$PATH"'], timeout=10).stdout
        assert "sbin" not in path, path  # the situation under test: sshd's PATH for a login user
        # node1 is reached as the login user, the others as root: the whole check, as `check` runs it
        transports = {0: conns[0], 1: t, 2: conns[2]}
        rep = run_checks(preset, transports, bandwidth_seconds=1)
    finally:
        t.close()
        close_all(conns)
        cluster.reset_firewall(1)
    fw = [f for f in rep.findings if f.check == "firewall"]
    assert [(f.code, f.node) for f in fw] == [("FIREWALL_UNREAD", 1)], [(f.code, f.message) for f in fw]
    assert "node1" in fw[0].message and fw[0].fix
    unread = rep.facts.links[1].firewall_unread
    # found in /usr/sbin, refused for want of root: that reason is given, not a silent "not found"
    assert unread and "iptables not readable" in unread and ("root" in unread or "ermission" in unread), unread
    assert rep.facts.links[1].firewall == []
    assert rep.verdict(1, "firewall") == "not checked" and rep.not_checked[(1, "firewall")] == unread
    assert rep.to_dict()["not_checked"]["node1"]["firewall"] == unread
    assert rep.verdict(0, "firewall") == "ok" and rep.verdict(2, "firewall") == "ok"  # root read them


def test_root_reads_the_same_rule(cluster, preset):
    port = str(preset.network.master_port)
    cluster.ns(1, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", port, "-j", "DROP")
    conns = connect_all(preset)
    try:
        assert conns.ok, conns.errors_text()
        facts = ClusterFacts()
        findings = check_firewalls(preset, dict(conns), facts)
    finally:
        close_all(conns)
        cluster.reset_firewall(1)
    assert facts.links[1].firewall_unread is None
    assert any(port in r and "DROP" in r for r in facts.links[1].firewall), facts.links[1].firewall
    assert [f.node for f in findings if f.code == "FIREWALL_RULES"] == [1]
