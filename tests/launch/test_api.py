"""The launch API (qwen_tui/run/api.py) that `replay`, `attach` and the wizard all call: a real
two-node local launch through it, its events in order; a node that cannot be connected is a
typed Failure naming it; a check error stops the launch before anything starts; attach on
ended and broken run directories."""

import json
import socket
import sys
import uuid

import pytest

from qwen_tui.preset.schema import Preset
from qwen_tui.run import api
from qwen_tui.run.rundir import RunDir
from support.launch_api import demo, launch_until_started, request
from support.paths import ROOT
from support.ports import free_port
from support.procs import run_processes


def launch_expecting_no_start(req, conns) -> list:
    """The events of a launch that must not start; one that did anyway is stopped, then fails the test."""
    events = list(api.launch(req, conns))
    for e in events:
        if isinstance(e, api.Started):
            api.stop(e.launcher)
            pytest.fail(f"the launch started: {events}")
    return events


@pytest.mark.slow
def test_a_local_launch_through_the_api_yields_its_steps_in_order_and_ends_ok(tmp_path):
    preset = demo(tmp_path, max_steps=3, logging_steps=1, save_strategy="no")
    rid = f"api-launch-{uuid.uuid4().hex[:8]}"  # unique: run_processes looks for it in command lines
    conns = api.Connections()
    la = None
    try:
        events = list(api.launch(request(tmp_path, preset, run_id=rid), conns))
        kinds = [type(e).__name__ for e in events]
        assert kinds == ["Stage", "Connected", "Checked", "Planned", "Stage", "Started"], events
        assert [e.name for e in events if isinstance(e, api.Stage)] == ["connect", "launch"]
        assert events[1].labels == {0: preset.cluster.nodes[0].label, 1: preset.cluster.nodes[1].label}
        assert events[2].result.errors == [] and events[2].result.facts.master_port_free is True
        plan = events[3].plan
        assert plan.run_id == rid and [c.argv[0] for c in plan.nodes] == [sys.executable] * 2
        la = events[-1].launcher
        assert la.run_dir.path == tmp_path / "runs" / rid and la.plan is plan

        follow = list(api.follow(la, interval=0.5, max_seconds=300, log_rank=lambda: 0))
        assert isinstance(follow[-1], api.Ended) and all(isinstance(e, api.Snapshot) for e in follow[:-1])
        out = follow[-1].outcome
        assert out.status == "ok", (out.message, la.log_tail(0, 30))
        last = follow[-2]
        assert last.progress.steps[-1]["step"] == 3 and last.nodes == {0: ("ok", None), 1: ("ok", None)}
        assert last.log_rank == 0 and last.log, "the snapshot carries node 0's log tail"
        state = json.loads((la.run_dir.path / "state.json").read_text())
        assert state["status"] == "ok"
        assert (la.run_dir.path / "preset.yaml").stat().st_mode & 0o777 == 0o600
        assert run_processes(rid) == []
    finally:
        if la is not None and la.poll() is None:  # a failed assertion must not leave the job running
            la.stop_all()
        conns.close()


def test_a_node_that_cannot_be_connected_is_a_typed_failure_naming_it(tmp_path):
    """Node 1 on a port nobody listens on: the launch stops at connect with a Failure that names
    node 1 and its host, says what to do, and starts nothing. Node 0 (local) stays connected."""
    closed = free_port()
    preset = Preset.model_validate({
        "cluster": {"nodes": [{"host": "localhost"}, {"host": "127.0.0.2", "port": closed, "user": "nobody"}],
                    "connect_timeout": 3, "known_hosts": str(tmp_path / "known_hosts")},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "device": "cpu"}})
    conns = api.Connections()
    try:
        events = launch_expecting_no_start(request(tmp_path, preset), conns)
        assert [type(e).__name__ for e in events] == ["Stage", "Failure"], events
        f = events[-1]
        assert f.stage == "connect" and list(f.nodes) == [1]
        assert f"node 1 ({preset.cluster.nodes[1].label})" in f.cause and "127.0.0.2" in f.cause, f.cause
        assert f.fix == "check the host name, port and that sshd runs (ssh -v HOST)"
        assert "node 0" not in f.cause
        assert not (tmp_path / "runs").exists(), "nothing may be recorded for a launch that did not start"
        assert sorted(conns.transports()) == [0]
    finally:
        conns.close()
    assert conns.transports() == {}


def test_connections_made_while_they_were_closed_are_not_kept(tmp_path):
    """The wizard closes its connections when the nodes change; a connect that was under way
    then must not keep (or hand back as good) transports to the old nodes."""
    preset = demo(tmp_path)
    conns = api.Connections()
    res = conns.connect(preset, on_progress=lambda i, what: conns.close())  # the nodes change mid-connect
    assert sorted(res.failed) == [0, 1] and "the nodes changed" in str(res.failed[0])
    assert conns.transports() == {}
    again = conns.connect(preset)
    assert again.ok and sorted(conns.transports()) == [0, 1]
    conns.close()


def test_a_check_error_stops_the_launch_before_anything_starts(tmp_path):
    """The master port is taken: the checks say PORT_IN_USE (an error), the launch ends with a
    check Failure carrying it, and no run directory is made. force=True would go on."""
    preset = demo(tmp_path)
    busy = socket.socket()
    busy.bind(("", preset.network.master_port))
    busy.listen()
    conns = api.Connections()
    try:
        events = launch_expecting_no_start(request(tmp_path, preset), conns)
        assert [type(e).__name__ for e in events] == ["Stage", "Connected", "Checked", "Failure"], events
        f = events[-1]
        assert f.stage == "check" and [a.code for a in f.items] == ["PORT_IN_USE"]
        assert "PORT_IN_USE" in f.cause and f.nodes == {0: f.items[0].message}
        assert not (tmp_path / "runs").exists()
        # check() alone says the same
        assert [a.code for a in api.check(preset, conns.transports(), local_python=sys.executable).errors] == \
            ["PORT_IN_USE"]
    finally:
        busy.close()
        conns.close()


def test_attach_says_when_a_run_has_ended_or_its_directory_is_broken(tmp_path):
    preset = demo(tmp_path)
    plan = api.plan(preset, run_id="old", root=tmp_path, base_dir=str(ROOT), local_python=sys.executable)
    rd = RunDir.create(tmp_path, "old")
    rd.write_plan(plan)
    rd.write_pids({0: 2 ** 22 + 7, 1: 2 ** 22 + 7})
    rd.write_state(status="ok", message="finished")
    events = list(api.attach(rd.path, api.Connections()))
    assert events == [api.AlreadyEnded("old", "ok", "finished")]

    (rd.path / "plan.json").write_text("{not json")
    (f,) = list(api.attach(rd.path, api.Connections()))
    assert isinstance(f, api.Failure) and f.stage == "attach" and "plan.json: not valid JSON" in f.cause


@pytest.mark.slow
def test_attach_finds_a_running_job_again_and_stop_ends_it_on_every_node(tmp_path):
    """A second face (new Connections) attaches to a job the first one started, follows it
    until it has trained a step, and stops it: the outcome is recorded as stopped and no
    process of the run is left."""
    preset = demo(tmp_path, max_steps=100000, logging_steps=1, save_strategy="no")
    rid = f"api-attach-{uuid.uuid4().hex[:8]}"
    first = api.Connections()
    started = launch_until_started(request(tmp_path, preset, run_id=rid), first)
    la = started[-1].launcher
    second = api.Connections()
    try:
        seen = []
        events = list(api.attach(la.run_dir.path, second, on_preset=seen.append))
        assert [type(e).__name__ for e in events] == ["Stage", "Connected", "Stage", "Started"], events
        assert [e.name for e in events if isinstance(e, api.Stage)] == ["connect", "attach"]
        assert seen and seen[0].cluster.nodes == preset.cluster.nodes
        again = events[-1].launcher
        assert again is not la and again.plan.run_id == rid and again.refusals() == {}
        for snap in api.follow(again, interval=0.5, max_seconds=240):
            if isinstance(snap, api.Ended):
                pytest.fail(f"the run ended by itself: {snap.outcome.message}")
            if snap.progress.steps:
                break
        res = api.stop(again)
        assert not res.already_ended and res.left == [] and res.outcome.status == "stopped"
        assert json.loads((la.run_dir.path / "state.json").read_text())["status"] == "stopped"
        assert run_processes(rid) == []
        assert list(api.attach(la.run_dir.path, second)) == [api.AlreadyEnded(rid, "stopped", res.outcome.message)]
    finally:
        if la.poll() is None:
            la.stop_all()
        first.close()
        second.close()
