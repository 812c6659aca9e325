"""The launcher's verdict on a failed attempt from the nodes' own logs and reachability (run/culprit.py with
run/watch/blame.py), on real files and this machine's transport, no training: a node with an error of its own is blamed
over the ones that only lost a peer; while only peers' losses are seen and the other nodes run and answer, the
verdict waits (bounded); a node that stopped answering meanwhile is the machine lost, with the evidence."""

from __future__ import annotations

import os

import yaml

from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.schema import Preset
from qwen_tui.run.events import Ended, Snapshot
from qwen_tui.run.follow import follow, stop
from qwen_tui.run.launcher import Launcher
from qwen_tui.run.rundir import RunDir
from qwen_tui.run.states import JobState
from qwen_tui.run.watch import blame
from support.paths import DEMO

RESET = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.9.0.12]:4001: "
         "Connection reset by peer")


def _launcher(tmp_path, n=3) -> Launcher:
    data = yaml.safe_load(DEMO.read_text())
    data["cluster"]["nodes"] = [{"host": "localhost", "gpus": 1} for _ in range(n)]
    data["training"]["output_dir"] = str(tmp_path / "out")
    rd = RunDir.create(tmp_path / "runs", "r1")
    plan = make_plan(Preset.model_validate(data), run_id="r1", local_run_dir=str(rd.path), base_dir=str(tmp_path))
    for c in plan.nodes:
        os.makedirs(c.run_dir, exist_ok=True)
    rd.write_state(status="running", started=1.0)
    return Launcher(plan, {c.rank: LocalTransport() for c in plan.nodes}, rd)


def _fail(la, rank, *lines):
    with open(la.plan.nodes[rank].log_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    la.nodes[rank].status, la.nodes[rank].rc = JobState.FAILED, 1


def test_an_error_of_its_own_is_blamed_over_a_lower_node_that_only_lost_a_peer(tmp_path):
    la = _launcher(tmp_path, n=2)
    _fail(la, 0, RESET)
    _fail(la, 1, "ValueError: something of this node's own")
    st, d, _ = la.culprit.find([la.nodes[0], la.nodes[1]])
    assert st.rank == 1 and d is None


def test_peers_losses_alone_wait_for_the_cause_then_a_silent_node_is_the_machine_lost(tmp_path, monkeypatch):
    la = _launcher(tmp_path, n=3)
    for r in range(3):
        la.nodes[r].status = JobState.RUNNING
    _fail(la, 0, RESET)
    _fail(la, 2, "RuntimeError: Connection closed by peer [10.9.0.12]:4001")
    assert la.culprit.find([la.nodes[0], la.nodes[2]]) is None  # node 1 runs and answers: not yet decided
    la.monitor.health.failed(1, "Unreachable: node1: connect timed out")
    st, d, tail = la.culprit.find([la.nodes[0], la.nodes[2]])
    assert st.rank == 1 and st.status == JobState.LOST and st.cause == blame.MACHINE_LOST and not tail
    assert d.code == "MACHINE_LOST" and d.line.startswith("node 1 (localhost) stopped answering over SSH")
    assert "node 0 (localhost) failed with a communication error: " + RESET in d.line


def test_past_the_grace_the_first_node_that_lost_a_peer_is_named(tmp_path, monkeypatch):
    la = _launcher(tmp_path, n=3)
    la.nodes[1].status = JobState.RUNNING
    _fail(la, 0, RESET)
    _fail(la, 2, RESET)
    assert la.culprit.find([la.nodes[0], la.nodes[2]]) is None
    la.culprit._survivors_since -= blame.CAUSE_GRACE_S + 1  # the grace is over and node 1 still answers
    st, d, _ = la.culprit.find([la.nodes[0], la.nodes[2]])
    assert st.rank == 0 and d.code == "CONN_RESET"


def test_a_failure_is_shown_at_the_look_that_names_it_and_the_nodes_are_stopped_at_the_next(tmp_path, monkeypatch):
    """A stop can wait out a connect timeout for each node that does not answer: the faces get the look that named
    the failure (its node's state, the monitor's notices) before it, not after."""
    la = _launcher(tmp_path, n=2)
    la.nodes[0].status = JobState.RUNNING
    _fail(la, 1, "ValueError: something of this node's own")
    stops: list[dict] = []
    real_stop = la.stop_all
    monkeypatch.setattr(la, "stop_all", lambda *a, **k: stops.append(dict(la.nodes)) or real_stop(*a, **k))
    events = follow(la, interval=0.01)
    named = next(events)
    assert isinstance(named, Snapshot) and named.nodes[1][0] == JobState.FAILED and la.failing and not stops
    rest = list(events)
    assert len(stops) == 1 and not la.failing
    ended = rest[-1]
    assert isinstance(ended, Ended) and ended.outcome.status == "failed" and ended.outcome.failed_rank == 1
    assert "node 1 (localhost) failed" in ended.outcome.message


def test_a_stop_asked_for_at_the_look_that_named_a_failure_records_the_failure(tmp_path):
    la = _launcher(tmp_path, n=2)
    la.nodes[0].status = JobState.RUNNING
    _fail(la, 1, "ValueError: something of this node's own")
    got = stop(la)
    assert got.already_ended and got.outcome.status == "failed" and got.outcome.failed_rank == 1, got
    assert la.run_dir.read_state()["status"] == "failed"
