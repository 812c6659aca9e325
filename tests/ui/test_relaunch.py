"""Bug 1 of issue 18: a second launch after the Run screen has shown a finished run hung
at "starting" (the new panels mounted before the old ones were removed, DuplicateIds,
and the worker's error was swallowed), and state.json stayed `running`. Two real demo
runs from one wizard: the second shows its own run and ends with a final state."""

from __future__ import annotations

import json

import pytest

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.widgets.gpu_panel import GpuPanel
from support.pilot import SIZE, wait_until
from support.procs import run_processes

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
ENDED = ("ok", "failed", "stopped")


async def _launch_and_finish(app, pilot, run, previous_id):
    await pilot.press("l")
    def started():
        relaunched = run.launcher is not None and run.launcher.plan.run_id != previous_id
        return relaunched or app.state.run_status == "failed"

    asked = []
    while not started():
        # the questions before a launch: errors found, an output dir that holds the last run; launch anyway
        await wait_until(pilot, lambda: started() or app.screen.is_modal, 60, "the launch")
        if app.screen.is_modal:
            asked.append(str(app.screen.query_one(".dialog-title").render()))
            await pilot.press("y")
            await pilot.pause()
    if previous_id is not None:
        assert "The output directory already holds a run" in asked
    assert app.state.run_status in ("running", *ENDED), str(run.query_one("#run-status").render())
    assert not app.screen.is_modal, "no error modal expected"
    await wait_until(pilot, lambda: app.state.run_status in ENDED, 300, "the run's end")
    return run.launcher.plan.run_id


async def test_second_launch_after_a_finished_run_shows_the_new_run(tmp_path, demo_copy, monkeypatch,
                                                                    stop_runs_after):
    preset = demo_copy(max_steps=4, logging_steps=1, save_strategy="no")
    runs = tmp_path / "runs"
    stop_runs_after(runs)
    monkeypatch.chdir(tmp_path)
    app = WizardApp(str(preset), runs_root=str(runs), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f6")
        await pilot.pause()
        run = app.get_screen("run")
        first = await _launch_and_finish(app, pilot, run, None)
        assert app.state.run_status == "ok", str(run.query_one("#run-status").render())

        second = await _launch_and_finish(app, pilot, run, first)
        assert second != first
        status = str(run.query_one("#run-status").render())
        assert app.state.run_status == "ok", status
        assert run.outcome.status == "ok"
        # the screen shows the new run: its panels (one per node, no leftovers) and its loss
        assert sorted(p.rank for p in run.query(GpuPanel)) == [0, 1]
        assert app.state.run_dir == runs / second
        await wait_until(pilot, lambda: run.last_snapshot and run.last_snapshot.progress.steps
                         and run.last_snapshot.progress.steps[-1]["step"] == 4, 10, "the second run's last step")
        await pilot.press("ctrl+q")
    for rid in (first, second):
        assert json.loads((runs / rid / "state.json").read_text())["status"] == "ok"
        assert run_processes(rid) == []


async def test_a_failing_run_worker_opens_an_error_modal_with_the_cause(tmp_path, demo_copy, monkeypatch):
    """No worker error is swallowed: the Run screen says not launched, and a modal names the
    exception, where it was raised and its cause."""
    from textual.widgets import Static

    from qwen_tui.ui.modals import Notice

    preset = demo_copy(max_steps=4)
    monkeypatch.chdir(tmp_path)
    app = WizardApp(str(preset), runs_root=str(tmp_path / "runs"), reattach=False)

    def broken_connect(*args, **kwargs):
        try:
            raise OSError("the socket said no")
        except OSError as e:
            raise RuntimeError("connecting went wrong") from e

    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f6")
        await pilot.pause()
        app.state.conns.connect = broken_connect  # the one way to make the real worker raise without a network fault
        await pilot.press("l")
        await wait_until(pilot, lambda: isinstance(app.screen, Notice), 20, "the error modal")
        body = str(app.screen.query_one(".dialog-body", Static).render())
        assert "RuntimeError: connecting went wrong" in body
        assert "caused by: OSError: the socket said no" in body
        assert "in broken_connect" in body
        assert app.state.run_status == "failed"
        await pilot.press("enter")
        await pilot.pause()
        run = app.get_screen("run")
        assert "not launched: RuntimeError: connecting went wrong" in str(run.query_one("#run-status").render())
