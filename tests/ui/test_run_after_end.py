"""The Run screen after a run ends, and the step bar while one runs: a run stopped elsewhere (its workers
exit cleanly, so each node reads "ok") shows its nodes as stopped; the panels drop their last sample and
the ETA goes; a new launch starts with an empty log; a healthy run is not marked `F6 Run !`."""

from __future__ import annotations

import pytest

from qwen_tui.run.api import Snapshot
from qwen_tui.run.launcher import RunOutcome
from qwen_tui.ui.messages import RunEnded, RunUpdate
from qwen_tui.ui.widgets.gpu_panel import GpuPanel
from qwen_tui.ui.widgets.log_pane import LogPane
from qwen_tui.ui.widgets.loss_chart import LossChart
from qwen_tui.ui.widgets.stepper import Stepper
from qwen_tui.wizard.state import LIVE
from screenshots.snapshot_app import make_app, show_synthetic_run, synthetic_progress
from support.paths import ROOT

pytestmark = pytest.mark.anyio


def bar(app) -> str:
    return app.screen.query_one(Stepper).render().plain


def panel_text(p: GpuPanel) -> str:
    from rich.console import Console

    con = Console(width=200, record=True, file=open("/dev/null", "w"))
    con.print(p.content)
    return con.export_text()


async def test_a_stopped_run_shows_stopped_nodes_no_sample_and_no_eta(monkeypatch):
    monkeypatch.chdir(ROOT)
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("f6")
        await pilot.pause()
        await show_synthetic_run(app)
        await pilot.pause(0.3)
        run = app.screen
        app.facts_changed()  # as on_run_started does
        await pilot.pause()
        assert app.state.step_status("run") == LIVE
        assert "F6 Run ▶" in bar(app) and "Run !" not in bar(app)
        panels = list(run.query(GpuPanel))
        assert all("GPU0" in panel_text(p) for p in panels)
        assert "ETA" in run.query_one(LossChart).summary
        # the follower's last look: every node exited cleanly (a stop asked for by another face)
        run.post_message(RunUpdate(Snapshot(nodes={0: ("ok", None), 1: ("ok", None)},
                                            progress=synthetic_progress(), log=[], log_rank=0)))
        run.post_message(RunEnded(RunOutcome("stopped", "stopped by request at step 40")))
        await pilot.pause(0.3)
        for p in panels:
            shown = panel_text(p)
            assert p.status == "stopped" and shown.startswith("stopped"), shown
            assert "GPU0" not in shown and "not watched: the run has ended" in shown
        summary = run.query_one(LossChart).summary
        assert "step 40/60" in summary and "ETA" not in summary
        assert "F6 Run !" in bar(app)  # stopped before its end: a warning now, not while it ran


async def test_a_new_launch_starts_with_an_empty_log(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    app = make_app()
    app.runs_root = tmp_path / "runs"
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("f6")
        await pilot.pause()
        await show_synthetic_run(app)
        await pilot.pause(0.3)
        run = app.screen
        log = run.query_one(LogPane)
        assert log.lines and "step 40/60" in log.lines[-1]
        run.post_message(RunEnded(RunOutcome("ok", "training finished on every node")))
        await pilot.pause(0.2)
        run.launch(force=False)  # the launch itself (of fake nodes) fails: the last run's log is gone already
        await pilot.pause()
        assert not any("step" in ln for ln in log.lines), log.lines  # only what the new attempt said, if anything
        assert run.query_one(LossChart).summary == ""
