"""The rehearsal: rendezvous + all-reduce over the real settings, bounded."""

from __future__ import annotations

import copy

import pytest

from qwen_tui.nodes.checks.rehearsal import rehearse
from qwen_tui.nodes.checks.runner import run_checks
from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.plan.launch import make_plan


@pytest.fixture(scope="module")
def probed(cluster, sshdir, keyed):
    from qwen_tui.preset.schema import Preset
    from support.cluster import preset_dict

    preset = Preset.model_validate(preset_dict(cluster, sshdir))
    conns = connect_all(preset)
    assert conns.ok, conns.errors_text()
    rep = run_checks(preset, dict(conns), network=False)
    yield preset, dict(conns), rep.facts
    close_all(conns)


def _plan(preset, facts, tmp_path):
    return make_plan(preset, run_id="r", local_run_dir=str(tmp_path), facts=facts)


def test_rehearsal_passes_on_the_healthy_cluster(probed, cluster, tmp_path):
    preset, conns, facts = probed
    plan = _plan(preset, facts, tmp_path)
    assert {c.env["GLOO_SOCKET_IFNAME"] for c in plan.nodes} == {"eth0"}
    res = rehearse(plan, conns, pythons={i: n.python for i, n in enumerate(preset.cluster.nodes)}, facts=facts)
    assert res.ok, (res.message, res.log_tails)
    assert res.meet_s is not None and 0 < res.meet_s < 30
    assert res.busbw_gbps and res.busbw_gbps > 0
    assert facts.rehearsal_ok is True and facts.rehearsal_bandwidth_gbps == res.busbw_gbps
    assert res.size_mb == facts.rehearsal_size_mb == 32 and "at 32 MB" in res.message  # gloo's default message
    assert facts.rehearsal_nodes == len(preset.cluster.nodes) == 3
    assert all(cluster.job_pids(i) == [] for i in range(len(cluster.nodes)))


def test_rehearsal_measures_a_smaller_message_where_the_link_is_too_slow_and_says_so(probed, cluster, tmp_path):
    """256 MB with a budget of 50 ms per all-reduce: no veth moves that, so the ranks agree on a smaller power of
    two, the figure says which, and the estimate reads it as a lower bound."""
    from qwen_tui.plan.estimate_comm import resolve_bandwidth

    preset, conns, facts = probed
    facts = copy.deepcopy(facts)
    res = rehearse(_plan(preset, facts, tmp_path), conns, facts=facts, size_mb=256, allreduce_budget_s=0.05,
                   pythons={i: n.python for i, n in enumerate(preset.cluster.nodes)})
    assert res.ok, (res.message, res.log_tails)
    assert 1 <= res.size_mb < 256 and res.size_mb == facts.rehearsal_size_mb
    assert "too slow for 256 MB" in res.message and res.wall_s < 30
    bw = resolve_bandwidth(facts)
    assert bw.source == "rehearsal" and bw.lower_bound and "reads low" in bw.detail


def test_rehearsal_fails_fast_naming_the_node_with_a_wrong_interface(probed, cluster, tmp_path):
    preset, conns, facts = probed
    bad = copy.deepcopy(facts)
    bad.nodes[2].route_interface = "eth9"  # what a wrong probe or a wrong preset would give
    plan = _plan(preset, bad, tmp_path)
    assert plan.nodes[2].env["GLOO_SOCKET_IFNAME"] == "eth9"
    res = rehearse(plan, conns, pythons={i: n.python for i, n in enumerate(preset.cluster.nodes)},
                   deadline_s=60)
    assert not res.ok
    assert res.failed_node == 2 and "node2" in res.message
    assert res.diagnosis is not None and res.diagnosis.code == "NO_SUCH_INTERFACE"
    assert res.wall_s < 30  # the others would wait 30 s for node 2; the rehearsal does not
    assert res.left_running == []
    assert all(cluster.job_pids(i) == [] for i in range(len(cluster.nodes)))


def test_rehearsal_logs_stay_out_of_the_workdir(probed, cluster, tmp_path):
    from support.cluster import REPO

    assert not (REPO / ".qwen-tui" / "rehearsal").exists()
    failed = list((cluster.nodes[2].home / ".qwen-tui" / "rehearsal").glob("*/node-2.log"))
    assert failed and b"eth9" in failed[0].read_bytes()  # the failed rehearsal's log is kept on the node
