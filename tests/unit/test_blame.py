"""Blame from evidence across nodes (run/watch/blame.py): a silent node whose peers stalled is lost, an SSH cut under a
training that goes on is not; the evidence names the lost node's address where a survivor's log does; a heartbeat
read in a shared directory counts only the node's own ranks. The same code runs against a machine made to vanish
for real in tests/cluster/test_machine_lost.py."""

from __future__ import annotations

from qwen_tui.run.watch.blame import STALL_MIN_S, Survivor, evidence_line, peer_stall, pick_lost, stall_bound
from qwen_tui.run.watch.watchdog import own_beats


def test_a_silent_node_whose_alive_peers_hold_their_phase_is_lost_after_the_stall_bound_not_the_ssh_bound():
    # node 1 went unreachable at t=100; ranks 0 and 2 still write heartbeats, each held in one phase since it went
    def at(age):
        return dict(now=100.0 + age, unreachable_since={1: 100.0}, alive={0: ("backward", age), 2: ("collective", age)},
                    step_times=[0.3] * 20, nodes=3)

    assert peer_stall(**at(STALL_MIN_S - 0.5)) is None
    got = peer_stall(**at(STALL_MIN_S + 0.5))
    assert got is not None and got.node == 1 and got.unreachable_s > STALL_MIN_S
    text = got.text("gpu-2", "Unreachable: connect timed out")
    assert text.startswith("node 1 (gpu-2) lost: unreachable over SSH for 10 s (Unreachable: connect timed out)")
    assert "its training peers lost it too" in text and "2 rank(s)" in text and "backward, collective" in text


def test_an_ssh_cut_while_ranks_move_through_their_phases_is_never_a_lost_machine():
    # one rank moves on (a phase of 0.2 s): steps still finish, only SSH is cut
    assert peer_stall(now=200.0, unreachable_since={1: 100.0}, alive={0: ("forward", 0.2), 2: ("collective", 50.0)},
                      step_times=[0.3] * 20, nodes=3) is None
    # before the first step (a model loading for minutes) the unreachable bound decides, not a stall
    assert peer_stall(now=200.0, unreachable_since={1: 100.0}, alive={0: ("start", 90.0), 2: ("start", 90.0)},
                      step_times=[], nodes=3) is None
    # nobody alive to tell (every other rank stopped too), or every node unreachable (the master's own link): no
    assert peer_stall(now=200.0, unreachable_since={1: 100.0}, alive={}, step_times=[], nodes=3) is None
    assert peer_stall(now=200.0, unreachable_since={0: 100.0, 1: 100.0}, alive={2: ("x", 99.0)}, step_times=[],
                      nodes=2) is None


def test_the_stall_bound_follows_step_times_and_stretches_while_most_ranks_save():
    assert stall_bound([], ["backward"]) == STALL_MIN_S
    assert stall_bound([4.0] * 10, ["backward", "forward"]) == 20.0
    assert stall_bound([0.3] * 10, ["checkpoint", "checkpoint", "forward"]) >= 600.0  # no save timed yet
    # once saves are timed (the worker logs each one's seconds), peers held in a checkpoint for 5 of the longest are
    # waiting for a lost node, not saving
    assert stall_bound([0.3] * 10, ["checkpoint", "checkpoint"], saves=[1.2, 3.0]) == 15.0
    assert stall_bound([0.3] * 10, ["eval", "eval"], saves=[1.0]) >= 600.0


def test_the_node_that_went_first_is_picked_and_the_evidence_names_its_address():
    assert pick_lost({}) is None and pick_lost({2: 3.0, 1: 9.0}) == 1
    text = evidence_line(1, "node1", "Unreachable: [Errno 111] Connection refused", 4.2,
                         [Survivor(0, "node0", "RuntimeError: [pair.cc:534] Connection closed by peer "
                                               "[10.77.0.3]:31337"),
                          Survivor(2, "node2", "RuntimeError: Connection reset by peer")],
                         {0: ["10.77.0.2"], 1: ["node1", "10.77.0.3"], 2: ["10.77.0.4"]})
    assert text.startswith("node 1 (node1) stopped answering over SSH 4 s ago (Unreachable: [Errno 111] "
                           "Connection refused)")
    assert "node 0 (node0) failed with a communication error, naming node 1's address 10.77.0.3" in text
    assert "node 2 (node2) failed with a communication error: RuntimeError: Connection reset by peer" in text


def test_a_heartbeat_directory_shared_by_nodes_gives_each_node_only_its_own_ranks():
    beats = {0: {"rank": 0, "node_rank": 0}, 1: {"rank": 1, "node_rank": 1}, 2: {"rank": 2, "node_rank": 2},
             3: {"rank": 3}}  # an older worker's heartbeat, without a node rank: kept
    assert sorted(own_beats(beats, 1)) == [1, 3]
    assert sorted(own_beats(beats, 0)) == [0, 3]
