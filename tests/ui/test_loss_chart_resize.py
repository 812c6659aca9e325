"""The loss chart fits its box at 160 columns and is drawn again, narrower, when the terminal shrinks
to 100 (it ran into the log pane)."""

from __future__ import annotations

import pytest

from qwen_tui.ui.widgets.loss_chart import LossChart
from screenshots.snapshot_app import make_app, show_synthetic_run

pytestmark = pytest.mark.anyio


def widest_line(chart: LossChart) -> int:
    """The plot's rows and the lr/eval lines (the summary line above them wraps as text)."""
    return max(part.cell_len for part in chart.content.renderables[1:])


async def test_chart_follows_the_terminal_size(monkeypatch):
    from support.paths import ROOT

    monkeypatch.chdir(ROOT)
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("f6")
        await pilot.pause()
        await show_synthetic_run(app)
        await pilot.pause(0.3)
        chart = app.screen.query_one(LossChart)
        wide = widest_line(chart)
        assert wide <= chart.size.width
        await pilot.resize_terminal(100, 30)
        await pilot.pause(0.3)
        assert chart.size.width < 60
        assert widest_line(chart) <= chart.size.width < wide
