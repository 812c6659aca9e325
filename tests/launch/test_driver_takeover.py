"""A run keeps its restarts when the face that launched it is gone: two local "nodes" with
`training.restarts: 1` launched by `qwen-tui replay`; replay is SIGKILLed mid-run (it cannot clean up, and
its driver record stays behind), node 1's ranks are killed, and `qwen-tui attach last` finds no live driver,
relaunches attempt 2 from the last checkpoint and follows it to the end."""

from __future__ import annotations

import json
import os
import signal

import pytest

from qwen_tui.nodes.jobs import local_procs
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


def test_attach_relaunches_a_run_whose_replay_was_killed(tmp_path):
    preset = preset_copy(tmp_path, max_steps=MAX_STEPS, save_steps=SAVE_STEPS, logging_steps=1,
                         per_device_train_batch_size=2, model_max_length=64, restarts=1)
    runs = tmp_path / "runs"
    cli = cli_in(tmp_path, runs)
    with open(tmp_path / "replay.log", "wb") as out:
        replay = cli("replay", str(preset), out=out)
    attach = None
    try:
        with HoldAtFirstCheckpoint(runs) as hold:
            rd, ckpt = wait_for_first_checkpoint(replay, hold, tmp_path / "replay.log")
            driver = json.loads((rd / "state.json").read_text()).get("driver")
            assert driver and driver["pid"] == replay.pid  # replay recorded itself as the run's driver
            # replay dies without a word (no cleanup, its record stays, it is a zombie until reaped); the run goes on
            os.kill(replay.pid, signal.SIGKILL)
            hold.kill("1")
        with open(tmp_path / "attach.log", "wb") as out:
            attach = cli("attach", "last", out=out)
        assert attach.wait(timeout=300) == 0, (tmp_path / "attach.log").read_text()[-4000:]
        followed = (tmp_path / "attach.log").read_text()
        assert "the face that launched this run is gone: attach relaunches it (attempt 2 of 2)" in followed, followed
        assert "training finished on every node" in followed
        assert replay.wait(timeout=10) == -signal.SIGKILL  # the relaunch was attach's, not replay's

        state = json.loads((rd / "state.json").read_text())
        a1, a2 = state["attempts"]
        assert (state["status"], state["attempt"], a1["status"], a1["next"]) == ("ok", 2, "failed", "restart")
        assert a1["failed_rank"] == 1, a1
        assert a2["status"] == "ok" and a1["nodes"] == a2["nodes"] and a2["world_size"] == 2
        assert a1["batch"] == a2["batch"]
        assert state["driver"] is None  # attach drove the run and ended its record when it returned
        resumed = int(a2["resume_from"].rsplit("-", 1)[1])
        assert resumed >= ckpt
        assert (rd / "attempt-2" / "node-1.rc").read_text().strip() == "0"
        recs = records(rd / "metrics.jsonl")
        starts = [r for r in recs if r.get("event") == "start"]
        assert [s["start_step"] for s in starts] == [0, resumed]
        after = [r["step"] for r in recs[recs.index(starts[1]):] if "loss" in r and "event" not in r]
        assert after == list(range(resumed + 1, MAX_STEPS + 1))  # the loss goes on from the checkpoint
        assert [r for r in recs if r.get("event") == "end"][-1]["status"] == "ok"
        left = [p for p in local_procs(-1, state["run_id"]) if p.state != "Z"]
        assert left == [], left  # no process of the run is left
    finally:
        for p in (replay, attach):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
                p.wait(timeout=60)
