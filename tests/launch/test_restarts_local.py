"""Recovery on the same nodes: two local "nodes" with `training.restarts: 1`; node 1's training rank is
killed mid-run, replay relaunches both nodes from the last checkpoint with the batch unchanged, and an
`attach` started before the failure follows the run into its second attempt."""

from __future__ import annotations

import json
import os
import signal

import pytest

from support.restarts import (
    MAX_STEPS,
    SAVE_STEPS,
    HoldAtFirstCheckpoint,
    cli_in,
    preset_copy,
    records,
    wait_for_first_checkpoint,
)

pytestmark = pytest.mark.slow


def test_a_killed_rank_is_relaunched_on_the_same_nodes_and_attach_follows(tmp_path):
    preset = preset_copy(tmp_path, max_steps=MAX_STEPS, save_steps=SAVE_STEPS, logging_steps=1,
                         per_device_train_batch_size=2, model_max_length=64, restarts=1)
    runs = tmp_path / "runs"
    cli = cli_in(tmp_path, runs)
    with open(tmp_path / "replay.log", "wb") as out:
        replay = cli("replay", str(preset), out=out)
    attach = None
    try:
        def attach_once(rd):
            nonlocal attach
            if attach is None:
                with open(tmp_path / "attach.log", "wb") as out:
                    attach = cli("attach", "last", out=out)

        with HoldAtFirstCheckpoint(runs) as hold:
            rd, ckpt = wait_for_first_checkpoint(replay, hold, tmp_path / "replay.log", on_run_dir=attach_once)
            hold.kill("1")
        assert replay.wait(timeout=400) == 0, (tmp_path / "replay.log").read_text()[-4000:]
        assert attach.wait(timeout=120) == 0, (tmp_path / "attach.log").read_text()[-4000:]
        followed = (tmp_path / "attach.log").read_text()
        assert "attempt 2 started; following it" in followed and "training finished on every node" in followed

        state = json.loads((rd / "state.json").read_text())
        a1, a2 = state["attempts"]
        assert (state["status"], state["attempt"], a1["status"], a1["next"]) == ("ok", 2, "failed", "restart")
        assert a1["failed_rank"] == 1, a1  # the node whose rank was killed, whichever view saw it first
        assert a1["nodes"] == a2["nodes"] and a2["excluded"] == [] and a2["world_size"] == 2
        assert a1["batch"] == a2["batch"] == "2 per device x 1 accumulation x 1 GPUs per node x 2 nodes = 4"
        resumed = int(a2["resume_from"].rsplit("-", 1)[1])
        assert resumed >= ckpt
        # the second attempt's logs and exit codes apart from the first's
        assert (rd / "node-1.rc").read_text().strip() not in ("", "0")
        assert (rd / "attempt-2" / "node-1.rc").read_text().strip() == "0"
        assert (rd / "attempt-2" / "node-0.log").stat().st_size > 0
        # and its heartbeats where the monitor reads them (the hang watchdog of a relaunched attempt)
        node1 = json.loads((rd / "plan.json").read_text())["nodes"][1]
        beats = node1["argv"][node1["argv"].index("--heartbeat_dir") + 1]
        assert beats == str(rd / "attempt-2" / "heartbeat"), beats
        assert json.loads((rd / "attempt-2" / "heartbeat" / "rank-1.json").read_text())["step"] == MAX_STEPS
        recs = records(rd / "metrics.jsonl")
        starts = [r for r in recs if r.get("event") == "start"]
        assert [s["start_step"] for s in starts] == [0, resumed] and starts[1]["gradient_accumulation_steps"] == 1
        after = [r["step"] for r in recs[recs.index(starts[1]):] if "loss" in r and "event" not in r]
        assert after == list(range(resumed + 1, MAX_STEPS + 1))
        assert [r for r in recs if r.get("event") == "end"][-1]["status"] == "ok"
    finally:
        for p in (replay, attach):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
                p.wait(timeout=60)
