"""The whole flow for real: launch the local-demo preset (two torchrun agents on this
machine, the tiny model) from the wizard, watch the loss panel update from the real
run, quit (the run goes on), reopen (it re-attaches), stop-all, and find no process
of the run left."""

from __future__ import annotations

import pytest

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.widgets.gpu_panel import GpuPanel
from qwen_tui.ui.widgets.loss_chart import LossChart
from support.pilot import SIZE, wait_until
from support.procs import run_processes

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_launch_watch_quit_reattach_stop_all(tmp_path, demo_copy, monkeypatch, stop_runs_after):
    preset = demo_copy(max_steps=100000, logging_steps=1, save_strategy="no")
    runs = tmp_path / "runs"
    stop_runs_after(runs)
    monkeypatch.chdir(tmp_path)

    app = WizardApp(str(preset), runs_root=str(runs), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f5")
        await pilot.pause()
        await pilot.press("l")
        if app.screen.is_modal:  # errors found: the confirmation says which; launch anyway
            await pilot.press("y")
        run = app.get_screen("run")
        await wait_until(pilot, lambda: run.launcher is not None or app.state.run_status == "failed", 60, "launch")
        assert app.state.run_status == "running", str(run.query_one("#run-status").render())
        run_id = run.launcher.plan.run_id
        # the loss panel updates from the real run: two different logged steps seen
        first = await wait_until(pilot, lambda: run.last_snapshot and len(run.last_snapshot.progress.steps) >= 1
                                 and run.last_snapshot.progress.steps[-1]["step"], 150, "the first logged step")
        await wait_until(pilot, lambda: run.last_snapshot.progress.steps[-1]["step"] > first, 60, "a later step")
        chart = run.query_one(LossChart).summary
        assert "loss" in chart and "step" in chart and "ETA" in chart
        # CPU-only nodes: each panel shows CPU load from its sampler
        panels = list(run.query(GpuPanel))
        await wait_until(pilot, lambda: all(p.sample is not None for p in panels), 10, "CPU samples")
        assert all(p.sample.cpu_only for p in panels) and len(panels) == 2
        assert panels[0].status == "running"
        await pilot.press("ctrl+q")  # quitting leaves the run going
    assert run_processes(run_id), "quitting the app must not stop the run"
    # and says so, with the commands that follow and stop it (printed on the terminal once the app is gone)
    assert app.quit_note and "goes on without the wizard" in app.quit_note, app.quit_note
    assert f"qwen-tui attach {run_id} " in app.quit_note and f"qwen-tui attach {run_id} --stop" in app.quit_note

    app2 = WizardApp(str(preset), runs_root=str(runs), reattach=True)
    async with app2.run_test(size=SIZE) as pilot:
        run = app2.get_screen("run")
        await wait_until(pilot, lambda: run.launcher is not None, 30, "re-attach")
        assert app2.screen.STEP == "run" and run.launcher.plan.run_id == run_id
        await wait_until(pilot, lambda: run.last_snapshot is not None, 15, "an update after re-attaching")
        await pilot.press("s")
        await pilot.pause()
        assert app2.screen.is_modal  # stop-all asks first
        await pilot.press("y")
        await wait_until(pilot, lambda: app2.state.run_status == "stopped", 60, "stop-all")
        assert run.outcome.status == "stopped"
        await pilot.press("ctrl+q")
    assert app2.quit_note is None  # the run was stopped: nothing goes on
    assert run_processes(run_id) == []
    state = (runs / run_id / "state.json").read_text()
    assert '"stopped"' in state
