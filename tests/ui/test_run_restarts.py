"""Restarts on the Run screen, for real: the local demo launched from the wizard with
`training.restarts: 1`; node 1's training rank is killed after a checkpoint. The wizard relaunches
the run from that checkpoint (run/recovery/restarts.py, as replay does), the status line says which attempt
this is, which node failed and where it resumed, and the screen follows the new attempt's nodes
and loss to the end; a wizard that re-attaches after the launching one quit relaunches it itself."""

from __future__ import annotations

import json
import os
import signal

import pytest
from textual.widgets import Static

from qwen_tui.ui.app import WizardApp
from support.pilot import SIZE, wait_until
from support.procs import ranks_of_job, run_processes
from support.restarts import HoldAtFirstCheckpoint

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
MAX_STEPS = 40


def _no_ranks(rd, run_id: str) -> str:
    """What the run directory and /proc say when node 1 shows no rank (seen in CI when the run had ended before the
    hold looked, which its slices now rule out)."""
    state = (rd / "state.json").read_text()[-1500:] if (rd / "state.json").is_file() else "no state.json"
    procs = {}
    for pid in run_processes(run_id):
        try:
            env = [e for e in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"QWEN_TUI_JOB" in e]
            procs[pid] = (open(f"/proc/{pid}/cmdline", "rb").read()[:160], env)
        except OSError:
            continue
    return f"no rank of node 1: pids.json {(rd / 'pids.json').read_text()}; state.json {state}; the run's processes {procs}"


async def _launch_to_a_checkpoint(app, pilot, hold):
    """Launch from the Run step (F6, l) and wait until `hold` holds the run at its first checkpoint with a step
    after it: the Run screen, the first attempt's launcher, its run directory and the checkpoint's step."""
    await pilot.press("f6")
    await pilot.pause()
    await pilot.press("l")
    run = app.get_screen("run")
    await wait_until(pilot, lambda: run.launcher is not None or app.state.run_status == "failed", 90, "launch")
    first = run.launcher
    await wait_until(pilot, lambda: hold.ckpt, 240, "a checkpoint and a step after it")
    assert hold.run_dir == first.run_dir.path
    return run, first, hold.run_dir, hold.ckpt


async def test_a_failed_attempt_is_relaunched_and_the_screen_follows_it(tmp_path, demo_copy, monkeypatch,
                                                                        stop_runs_after):
    preset = demo_copy(max_steps=MAX_STEPS, save_steps=4, logging_steps=1, per_device_train_batch_size=2,
                       model_max_length=64, restarts=1)
    runs = tmp_path / "runs"
    stop_runs_after(runs)
    monkeypatch.chdir(tmp_path)
    app = WizardApp(str(preset), runs_root=str(runs), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        with HoldAtFirstCheckpoint(runs) as hold:
            run, first, rd, ckpt = await _launch_to_a_checkpoint(app, pilot, hold)
            hold.kill("1")

        # the second attempt: a new launcher, and the status line says why and from where
        # the screen takes the new launcher before it writes the status line: wait for both
        await wait_until(pilot, lambda: run.launcher is not first and run.launcher.attempt == 2
                         and "attempt 2 of 2" in str(run.query_one("#run-status", Static).render()), 240,
                         "the second attempt and its status line")
        status = str(run.query_one("#run-status", Static).render())
        assert status.startswith("running · attempt 2 of 2; after node 1 (localhost) failed"), status
        assert "resumed from " in status and "/checkpoint-" in status, status
        resumed = int(status.split("/checkpoint-", 1)[1].split(";")[0].split(" ")[0])
        assert resumed >= ckpt
        assert app.state.run_status == "running"  # a failed attempt that is relaunched is not the run's end

        # the screen follows the new attempt's loss, to the end
        await wait_until(pilot, lambda: run.last_snapshot.progress.steps
                         and run.last_snapshot.progress.steps[-1]["step"] > resumed + 1, 240, "the new attempt's steps")
        await wait_until(pilot, lambda: app.state.run_status in ("ok", "failed", "stopped"), 300, "the end")
        assert app.state.run_status == "ok", str(run.query_one("#run-status", Static).render())
        assert run.last_snapshot.progress.steps[-1]["step"] == MAX_STEPS
    state = json.loads((rd / "state.json").read_text())
    assert state["status"] == "ok" and [a["attempt"] for a in state["attempts"]] == [1, 2]
    assert state["attempts"][0]["failed_rank"] == 1 and state["attempts"][0]["next"] == "restart"
    assert run_processes(first.plan.run_id) == []


async def test_a_reattached_wizard_relaunches_a_run_whose_launching_wizard_quit(tmp_path, demo_copy, monkeypatch,
                                                                                 stop_runs_after):
    """The wizard that launched the run quits (the run goes on, with nobody to relaunch it); node 1's ranks are
    killed; a wizard opened later re-attaches, finds no live driver and relaunches attempt 2 itself."""
    preset = demo_copy(max_steps=MAX_STEPS, save_steps=4, logging_steps=1, per_device_train_batch_size=2,
                       model_max_length=64, restarts=1)
    runs = tmp_path / "runs"
    stop_runs_after(runs)
    monkeypatch.chdir(tmp_path)
    app = WizardApp(str(preset), runs_root=str(runs), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        with HoldAtFirstCheckpoint(runs) as hold:
            run, first, rd, ckpt = await _launch_to_a_checkpoint(app, pilot, hold)
            victims = ranks_of_job(json.loads((rd / "pids.json").read_text())["1"])
            assert victims, _no_ranks(rd, first.plan.run_id)
            for pid in victims:  # the run waits while the wizard quits: the failure comes after it is gone
                os.kill(pid, signal.SIGSTOP)
            try:
                await pilot.press("ctrl+q")
            finally:
                hold.kill("1")

    app2 = WizardApp(str(preset), runs_root=str(runs), reattach=True)
    async with app2.run_test(size=SIZE) as pilot:
        run = app2.get_screen("run")
        await wait_until(pilot, lambda: run.launcher is not None and run.launcher.attempt == 2
                         and "attempt 2 of 2" in str(run.query_one("#run-status", Static).render()), 240,
                         "the second attempt, launched by the re-attached wizard, and its status line")
        status = str(run.query_one("#run-status", Static).render())
        assert "attempt 2 of 2; after node 1 (localhost) failed" in status, status
        await wait_until(pilot, lambda: app2.state.run_status in ("ok", "failed", "stopped"), 300, "the end")
        assert app2.state.run_status == "ok", str(run.query_one("#run-status", Static).render())
    state = json.loads((rd / "state.json").read_text())
    a1, a2 = state["attempts"]
    assert (state["status"], a1["next"], a1["failed_rank"], a2["status"]) == ("ok", "restart", 1, "ok")
    assert int(a2["resume_from"].rsplit("-", 1)[1]) >= ckpt
    assert state["driver"] is None
    assert run_processes(first.plan.run_id) == []
