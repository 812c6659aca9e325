"""A stop the user asked for ends the run quietly: a real two-node local launch of the tiny demo,
stopped mid-run through the launch API, and one stopped at once, while its workers still import torch. While the stop runs, follow() says where each node is;
afterwards every node's log ends with the worker's "stopped by request at step N" line and no
traceback (neither the worker's nor torchrun's), the run is recorded as stopped, the metrics'
end record says stopped, and no process of the run is left."""

import json
import time
import uuid

import pytest

from qwen_tui.run import api
from support.launch_api import demo, launch_until_started, request
from support.procs import assert_quiet_stop_logs, importing_torch, run_processes


@pytest.mark.slow
def test_a_stop_mid_run_ends_every_node_quietly_and_says_how_far_it_is(tmp_path):
    preset = demo(tmp_path, max_steps=100000, logging_steps=1, save_strategy="no")
    rid = f"api-stop-{uuid.uuid4().hex[:8]}"
    conns = api.Connections()
    la = launch_until_started(request(tmp_path, preset, run_id=rid), conns)[-1].launcher
    try:
        stopping, ended = [], None
        for ev in api.follow(la, interval=0.5, max_seconds=300):
            if isinstance(ev, api.Snapshot) and ev.progress.steps and not la.stop_requested:
                la.request_stop()  # trained a step: stop it, as the wizard's s or replay's ctrl-c does
            elif isinstance(ev, api.Stopping):
                stopping.append(ev)
            elif isinstance(ev, api.Ended):
                ended = ev.outcome
        assert ended is not None and ended.status == "stopped", ended
        # progress per node while it ran: each node named, and the last word for each is "stopped"
        assert stopping, "follow() said nothing while the stop ran"
        seen = {r: [ev.nodes[r] for ev in stopping if r in ev.nodes] for r in (0, 1)}
        assert all(seen.values()), seen
        assert any("waiting" in w for ws in seen.values() for w in ws), seen
        assert all(ws[-1] == "stopped" for ws in seen.values()), seen  # not killed: they ended on their own
        assert stopping[-1].text.startswith("stopping") and "node 1 (localhost)" in stopping[-1].text

        assert_quiet_stop_logs(la.plan)
        state = json.loads((la.run_dir.path / "state.json").read_text())
        assert state["status"] == "stopped", state
        end = [json.loads(ln) for ln in (la.run_dir.path / "metrics.jsonl").read_text().splitlines()
               if '"end"' in ln]
        assert end and end[-1]["status"] == "stopped" and end[-1]["step"] >= 1, end
        assert run_processes(rid) == []
    finally:
        if la.poll() is None:
            la.stop_all()
        conns.close()


@pytest.mark.slow
def test_a_stop_while_the_workers_still_start_ends_every_node_quietly(tmp_path):
    # the user launches and stops at once: the ranks exist but are still importing torch and building the
    # model; before the worker's own handler a SIGTERM killed them, and each torchrun agent printed a traceback
    preset = demo(tmp_path, max_steps=100000, logging_steps=1, save_strategy="no")
    rid = f"api-early-stop-{uuid.uuid4().hex[:8]}"
    conns = api.Connections()
    la = launch_until_started(request(tmp_path, preset, run_id=rid), conns)[-1].launcher
    try:
        pids = json.loads((la.run_dir.path / "pids.json").read_text())
        deadline = time.monotonic() + 60
        while not all(importing_torch(int(p)) for p in pids.values()):
            assert time.monotonic() < deadline and la.poll() is None, "the ranks did not start importing torch"
            time.sleep(0.02)
        metrics = la.run_dir.path / "metrics.jsonl"
        assert not metrics.exists() or '"start"' not in metrics.read_text(), "the run trained before the stop"
        res = api.stop(la)
        assert res.outcome.status == "stopped" and not res.left, res

        assert_quiet_stop_logs(la.plan, when="before training started")
        assert json.loads((la.run_dir.path / "state.json").read_text())["status"] == "stopped"
        assert run_processes(rid) == []
    finally:
        if la.poll() is None:
            la.stop_all()
        conns.close()
