"""The monitor's judgements, on a clock the test turns: when a node is unreachable and back and given up on
(run/watch/health.py), when a run is hung and who holds it (run/watch/watchdog.py), which node is a straggler
(run/watch/stragglers.py), what the evidence line says (run/watch/evidence.py), and the notices file
(run/watch/notices.py).
The same code runs against real faults in tests/cluster/test_field_faults.py."""

from __future__ import annotations

import json

from qwen_tui.run.watch.evidence import parse_evidence
from qwen_tui.run.watch.health import Health, backoff
from qwen_tui.run.watch.notices import Notice, append_notice, read_notices
from qwen_tui.run.watch.stragglers import StragglerWatch, node_times
from qwen_tui.run.watch.watchdog import MIN_BOUND_S, HangWatch, parse_beats


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _health(clock, **kw):
    said: list[Notice] = []
    h = Health({0: "gpu-1", 1: "gpu-2"}, say=said.append, clock=clock, **kw)
    return h, said


def test_one_failed_read_makes_a_node_unreachable_not_lost_and_the_next_good_read_brings_it_back():
    clock = Clock()
    h, said = _health(clock, bound=120)
    h.failed(1, "TransportError: reading node-1.rc timed out after 15s")
    assert h.unreachable(1) and not h.unreachable(0)
    assert [n.kind for n in said] == ["UNREACHABLE"]
    assert "node 1 (gpu-2) unreachable" in said[0].text and "training goes on" in said[0].text
    assert not h.due(1)  # retried after a backoff, not at every look
    clock.t += backoff(1)
    assert h.due(1)
    h.failed(1, "Unreachable: connect timed out")  # still down: no second notice
    assert len(said) == 1 and h.nodes[1].failures == 2
    clock.t += 35
    assert h.note(1).startswith("unreachable for 36 s; training goes on")
    assert h.past_bound() == []
    h.ok(1)
    assert [n.kind for n in said] == ["UNREACHABLE", "REACHABLE"] and "after 36 s" in said[1].text
    assert not h.unreachable(1) and h.note(1) is None and h.due(1)


def test_past_the_bound_a_node_is_given_up_once_after_a_fresh_read_fails_and_only_stop_acts_on_it():
    clock = Clock()
    h, said = _health(clock, bound=120, on_bound="keep")
    h.failed(0, "no answer for 9 s", started=clock.t - 9)
    clock.t += 111
    assert h.past_bound() == []  # 120 s since the read that went unanswered began: not yet past it
    clock.t += 1
    assert h.due(0)  # past the bound: one more read first, whatever the backoff says
    assert h.past_bound() == []  # nothing is given up on a read tried before the bound
    h.failed(0, "Unreachable: connect timed out", started=clock.t)
    assert h.past_bound() == [0] and h.past_bound() == []
    assert said[-1].kind == "UNREACHABLE_BOUND" and "keeps trying" in said[-1].text
    assert h.note(0).endswith("training goes on (Unreachable: connect timed out)")
    h2, said2 = _health(clock, bound=10, on_bound="stop")
    h2.failed(1, "boom")
    clock.t += 11
    assert h2.due(1) and h2.past_bound() == []
    h2.ok(1)  # the link came back just before the bound's read: the node is back, never given up
    assert said2[-1].kind == "REACHABLE" and h2.past_bound() == []
    h2.failed(1, "boom")
    clock.t += 11
    h2.failed(1, "boom again")
    assert h2.past_bound() == [1] and "every node is stopped" in said2[-1].text


def _beat(rank, step, phase="backward", t=0.0, node=None, since=0.0):
    return {"rank": rank, "step": step, "phase": phase, "time": t, "node_rank": rank if node is None else node,
            "phase_since": since, "pid": 100 + rank}


def test_no_hang_is_called_before_the_first_step_or_within_the_bound():
    clock = Clock()
    w = HangWatch(clock=clock)
    assert w.observe({0: _beat(0, 0, "start"), 1: _beat(1, 0, "start")}, []) is None
    clock.t += 3600  # loading a large model takes as long as it takes
    assert w.observe({0: _beat(0, 0, "start", 1), 1: _beat(1, 0, "start", 1)}, []) is None
    assert w.observe({0: _beat(0, 1, t=2), 1: _beat(1, 1, t=2)}, [1.0]) is None
    clock.t += MIN_BOUND_S - 1
    assert w.observe({0: _beat(0, 1, t=3), 1: _beat(1, 1, t=3)}, [1.0]) is None


def test_a_stopped_rank_is_named_by_its_heartbeat_that_no_longer_changes():
    clock = Clock()
    w = HangWatch(bound_s=30, clock=clock)
    w.observe({r: _beat(r, 5, t=1.0) for r in range(4)}, [0.5] * 10)
    for k in range(1, 8):  # ranks 0, 1, 3 keep writing; rank 2 (node 1) stopped at t=1
        clock.t += 5
        v = w.observe({0: _beat(0, 5, t=1.0 + k, node=0), 1: _beat(1, 5, t=1.0 + k, node=0),
                       2: _beat(2, 5, "data", t=1.0, node=1), 3: _beat(3, 5, t=1.0 + k, node=1)}, [0.5] * 10)
        if clock.t - 1000 <= 30:
            assert v is None
        else:
            break
    assert v is not None and v.culprits == [2] and v.node == 1 and v.phase == "data"
    assert "heartbeat stopped" in v.reason and v.bound == 30
    assert "node 1 (b), rank 2, in phase data" in v.text({0: "a", 1: "b"})
    clock.t += 5  # said once for one stall
    assert w.observe({0: _beat(0, 5, t=50)}, []) is None and w.fired
    w.observe({0: _beat(0, 6, t=51)}, [])  # a step finished: the stall is over
    assert not w.fired


def test_a_stopped_rank_is_named_within_the_normal_bound_while_the_others_wait_in_a_checkpoint():
    clock = Clock()
    w = HangWatch(bound_s=20, clock=clock)
    w.observe({r: _beat(r, 8, "checkpoint", t=0.0) for r in range(3)}, [])
    v = None
    for k in range(1, 8):  # ranks 0 and 1 wait in the checkpoint's collective; rank 2 stopped in it
        clock.t += 5
        v = v or w.observe({0: _beat(0, 8, "checkpoint", t=k), 1: _beat(1, 8, "checkpoint", t=k),
                            2: _beat(2, 8, "checkpoint", t=0.0)}, [])
    assert v is not None and v.culprits == [2] and v.bound == 20  # not the 600 s a checkpoint may take
    w2 = HangWatch(bound_s=20, clock=clock)  # every rank still writing: a slow checkpoint, not a hang
    w2.observe({r: _beat(r, 8, "checkpoint", t=0.0) for r in range(3)}, [])
    for k in range(1, 30):
        clock.t += 5
        assert w2.observe({r: _beat(r, 8, "checkpoint", t=k) for r in range(3)}, []) is None


def test_without_a_stopped_heartbeat_the_rank_behind_then_the_odd_phase_is_named():
    clock = Clock()
    w = HangWatch(bound_s=20, clock=clock)
    beats = {0: _beat(0, 8, "collective"), 1: _beat(1, 7, "data"), 2: _beat(2, 8, "collective")}
    w.observe(beats, [])
    for k in range(1, 6):
        clock.t += 5
        v = w.observe({r: {**b, "time": float(k)} for r, b in beats.items()}, [])
    assert v.culprits == [1] and "at step 7 while the others finished step 8" in v.reason
    w2 = HangWatch(bound_s=20, clock=clock)
    beats = {0: _beat(0, 8, "collective"), 1: _beat(1, 8, "checkpoint"), 2: _beat(2, 8, "collective")}
    w2.observe(beats, [])
    for k in range(1, 6):
        clock.t += 5
        v = w2.observe({r: {**b, "time": float(k)} for r, b in beats.items()}, [])
    assert v.culprits == [1] and "wait in phase collective" in v.reason


def test_the_bound_follows_the_runs_own_step_times_and_stretches_for_checkpoints():
    w = HangWatch()
    assert w.bound([], ["backward"]) == MIN_BOUND_S
    assert w.bound([40.0] * 20, ["backward"]) == 200.0  # 5 x the median step
    assert w.bound([40.0] * 20, ["checkpoint", "checkpoint", "backward"]) == 2000.0
    assert w.bound([1.0], ["eval"]) == 1200.0  # 10 x the 120 s floor
    assert HangWatch(bound_s=30).bound([1.0], ["eval"]) == 600.0
    assert HangWatch(bound_s=15).bound([40.0], ["backward"]) == 15.0


def test_heartbeats_are_parsed_one_a_line_and_damage_is_skipped():
    text = json.dumps(_beat(0, 3)) + "\n" + '{"rank": 1, "step": "x"}\n{not json\n\n' + json.dumps(_beat(2, 4))
    assert sorted(parse_beats(text)) == [0, 2]


def _rec(compute, nodes=None):
    nodes = nodes or list(range(len(compute)))
    return {"step": 1, "loss": 1.0, "rank_compute_s": compute, "rank_wait_s": [0.1] * len(compute), "rank_node": nodes}


def test_a_node_slower_than_the_others_for_n_records_is_named_once_and_released_when_it_keeps_pace():
    w = StragglerWatch(threshold=0.2, steps=3)
    recs = [_rec([1.0, 1.05, 1.6, 1.0])]
    assert w.feed(recs) == ([], [])
    recs += [_rec([1.0, 1.0, 1.5, 1.1]), _rec([1.0, 1.0, 1.7, 1.0])]
    new, over = w.feed(recs)
    assert [s.node for s in new] == [2] and new[0].records == 3 and abs(new[0].slower - 0.7) < 1e-9
    assert w.note(2) == "compute 1.70 s/step, waits 0.10 s (straggler)"
    recs += [_rec([1.0, 1.0, 1.8, 1.0])]
    assert w.feed(recs) == ([], [])  # named once
    recs += [_rec([1.0, 1.0, 1.0, 1.0])] * 3
    assert w.feed(recs) == ([], [2])


def test_small_gaps_and_a_slow_streak_that_breaks_are_not_stragglers():
    w = StragglerWatch(threshold=0.2, steps=3)
    assert w.feed([_rec([0.03, 0.02, 0.02])] * 5) == ([], [])  # rank 0's own bookkeeping on a tiny model
    w = StragglerWatch(threshold=0.2, steps=3)
    recs = [_rec([1.0, 2.0]), _rec([1.0, 2.0]), _rec([1.0, 1.0]), _rec([1.0, 2.0]), _rec([1.0, 2.0])]
    assert w.feed(recs) == ([], [])


def test_a_nodes_compute_is_its_slowest_rank():
    assert node_times(_rec([1.0, 3.0, 2.0, 0.5], [0, 0, 1, 1])) == {0: (3.0, 0.1), 1: (2.0, 0.1)}
    assert node_times({"step": 1}) is None
    assert node_times(_rec([1.0, "x"])) is None


def test_the_evidence_line_says_what_the_node_answered_and_nothing_made_up():
    text = "3.52 2.10 1.00 3/200 999\n2\n97, 1410, 1980, 84\n0, 345, 1980, 41\n"
    assert parse_evidence(text) == ["CPU load 3.5 on 2 cores", "GPUs 97% at 1410/1980 MHz, 84 C; 0% at 345/1980 MHz, 41 C"]
    assert parse_evidence("0.10 0.20 0.30 1/100 5\n16\n") == ["CPU load 0.1 on 16 cores"]
    assert parse_evidence("garbage") == []


def test_notices_round_trip_through_the_run_directory_and_a_damaged_line_is_skipped(tmp_path):
    append_notice(tmp_path, Notice("HANG", "HANG: node 1 ...", 1, at=5.0, attempt=2, details={"stacks": "/x"}))
    with open(tmp_path / "notices.jsonl", "a") as f:
        f.write('{"kind": "HANG", "te\n')
    append_notice(tmp_path, Notice("REACHABLE", "node 0 back", 0))
    got = read_notices(tmp_path)
    assert [(n.kind, n.node, n.attempt) for n in got] == [("HANG", 1, 2), ("REACHABLE", 0, 1)]
    assert got[0].details == {"stacks": "/x"} and got[0].level == "error"
    assert (tmp_path / "notices.jsonl").stat().st_mode & 0o777 == 0o600


def _monitor(tmp_path, clock, nodes=3):
    from types import SimpleNamespace

    from qwen_tui.run.watch.metrics import TrainingProgress
    from qwen_tui.run.watch.monitor import RunMonitor

    plan = SimpleNamespace(nodes=[SimpleNamespace(rank=i, label=f"n{i}") for i in range(nodes)],
                           monitor={"hang_timeout": 20, "on_hang": "alert"})
    la = SimpleNamespace(plan=plan, nodes={}, transports={}, run_dir=SimpleNamespace(path=tmp_path),
                         metrics=SimpleNamespace(progress=TrainingProgress()), attempt=1, _ref=lambda r: None)
    mon = RunMonitor(la)
    mon.hang = HangWatch(bound_s=20, clock=clock)
    mon.health.clock = clock
    return mon


def test_an_unreachable_nodes_old_heartbeats_are_no_stopped_rank_and_a_finished_run_no_hang(tmp_path):
    clock = Clock()
    mon = _monitor(tmp_path, clock)
    mon._collect = lambda v: (tmp_path / "stacks", "not collected in this test")
    for k in range(8):  # node 1 cannot be read: its last heartbeat stays as it was; nodes 0 and 2 go on stepping
        mon.beats = {0: {0: _beat(0, 10 + k, t=k)}, 1: {1: _beat(1, 10, t=0.0)}, 2: {2: _beat(2, 10 + k, t=k)}}
        if k == 1:
            mon.health.failed(1, "no answer for 9 s")
        mon._watch_hang()
        clock.t += 5
    assert mon.verdict is None and [n.kind for n in mon.notices] == ["UNREACHABLE"]
    for _ in range(8):  # now the run stalls too: the node nobody can read is blamed, not a "stopped" rank
        mon._watch_hang()
        clock.t += 5
    assert mon.verdict is not None and mon.verdict.node == 1 and "cannot be read" in mon.verdict.reason
    assert mon.notices[-1].kind == "HANG"
    done = _monitor(tmp_path, clock)
    done.la.metrics.progress.add({"event": "end", "status": "ok", "step": 17})
    for _ in range(10):  # every rank still "in backward" by its last heartbeat, but the master said it ended ok
        done.beats = {0: {0: _beat(0, 17, t=0.0)}}
        done._watch_hang()
        clock.t += 5
    assert done.verdict is None and done.notices == []
