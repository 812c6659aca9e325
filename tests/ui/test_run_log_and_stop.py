"""The Run screen with a real run (the local demo: two torchrun agents, the tiny model): the log
pane wraps a 300-character line at 100x30 and at 160x48 (no sideways scrolling), follows the tail
as lines arrive, stays where the user scrolled up to, `n` shows the next node's log; then a stop
shows each node's progress while it runs and leaves logs that end quietly (no traceback)."""

from __future__ import annotations

import pytest
from textual.widgets import Label, Static

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.widgets.gpu_panel import GpuPanel
from qwen_tui.ui.widgets.log_pane import LogPane
from support.pilot import wait_until
from support.procs import assert_quiet_stop_logs, run_processes

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
# 300+ characters with few spaces, as a traceback's line is
LONG = "a long line: " + "/very/long/path/segment" * 12 + " " + "x" * 20


def assert_wrapped(pane: LogPane) -> None:
    """Every line fits the pane's width: nothing to scroll sideways, and the long line takes several rows."""
    text = pane.query_one("#log-text", Static)
    assert pane.max_scroll_x == 0 and text.size.width <= pane.scrollable_content_region.width, (
        pane.max_scroll_x, text.size, pane.size)
    assert text.size.height >= len(pane.lines) + len(LONG) // max(1, text.size.width) - 1, (
        text.size, len(pane.lines))


async def test_log_pane_wraps_follows_and_stop_shows_progress(tmp_path, demo_copy, monkeypatch, stop_runs_after):
    preset = demo_copy(max_steps=100000, logging_steps=1, save_strategy="no")
    runs = tmp_path / "runs"
    stop_runs_after(runs)
    monkeypatch.chdir(tmp_path)
    app = WizardApp(str(preset), runs_root=str(runs), reattach=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f6")
        await pilot.pause()
        await pilot.press("l")
        run = app.get_screen("run")
        await wait_until(pilot, lambda: run.launcher is not None or app.state.run_status == "failed", 90, "launch")
        assert app.state.run_status == "running", str(run.query_one("#run-status").render())
        la = run.launcher
        pane = run.query_one(LogPane)
        await wait_until(pilot, lambda: run.last_snapshot and run.last_snapshot.progress.steps, 180, "a first step")

        # a long line in node 0's log (as a traceback's would be): shown whole, wrapped to the pane
        with open(la.plan.nodes[0].log_path, "a", encoding="utf-8") as f:
            f.write(LONG + "\n")
        await wait_until(pilot, lambda: LONG in pane.lines, 30, "the long line in the pane")
        await pilot.pause()
        assert_wrapped(pane)

        # it follows the tail as lines arrive
        n = len(pane.lines)
        await wait_until(pilot, lambda: len(pane.lines) > n + 3, 30, "more lines")
        await wait_until(pilot, lambda: pane.max_scroll_y > 0 and pane.scroll_y == pane.max_scroll_y, 30,
                         "the pane at its tail")
        # scrolled up by the user, it stays there while lines arrive
        pane.focus()
        await pilot.press("home")
        assert not pane.following  # at once: where the scroll is going counts
        # Home scrolls there in an animation of fixed duration, which a loaded machine can outlast a pause
        await wait_until(pilot, lambda: pane.scroll_y == 0, 30, "the pane at its top")
        n = len(pane.lines)
        await wait_until(pilot, lambda: len(pane.lines) > n + 3, 30, "lines while scrolled up")
        await pilot.pause()
        assert pane.scroll_y == 0 and pane.max_scroll_y > 0
        await pilot.press("end")  # back at the tail: it follows again, as lines arrive
        n = len(pane.lines)
        await wait_until(pilot, lambda: len(pane.lines) > n + 3, 30, "lines after going back to the tail")
        await wait_until(pilot, lambda: pane.following and pane.scroll_y > 0, 30, "the pane at its tail again")

        # at 160x48 the long line still fits the pane
        await pilot.resize_terminal(160, 48)
        await pilot.pause(0.5)
        assert_wrapped(pane)

        # n: the next node's log (its own lines, not node 0's long one)
        run.focus()
        await pilot.press("n")
        await wait_until(pilot, lambda: pane.rank == 1 and pane.lines, 30, "node 1's log")
        assert LONG not in pane.lines and any("[rank 1]" in ln for ln in pane.lines), pane.lines[-5:]
        assert "node 1" in str(run.query_one("#log-title", Label).render())

        # stop: the status line and each node's panel say where its stop is, until it has stopped
        await pilot.press("s")
        await pilot.pause()
        assert app.screen.is_modal
        await pilot.press("y")
        seen = []

        def stopping() -> bool:
            seen.append(str(run.query_one("#run-status", Static).render()))
            notes = [p.note for p in run.query(GpuPanel)]
            return seen[-1].startswith("stopping (") and all(notes) and notes

        await wait_until(pilot, stopping, 30, "the stop's progress")
        assert "node 0 (localhost)" in seen[-1] and "node 1 (localhost)" in seen[-1], seen[-1]
        await wait_until(pilot, lambda: app.state.run_status == "stopped", 60, "the stop")
        assert run.outcome.status == "stopped"
        assert str(run.query_one("#run-status", Static).render()).startswith("stopped: ")
    assert_quiet_stop_logs(la.plan)
    assert run_processes(la.plan.run_id) == []
