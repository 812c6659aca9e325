"""The log pane's merge of each new tail into what it shows (widgets/log_pane.py): only lines not
shown yet are added, a half-written last line is replaced by its whole, and a gap says so."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from qwen_tui.ui.widgets.log_pane import KEEP, SKIPPED, LogPane, new_lines

pytestmark = [pytest.mark.anyio]


def test_new_lines_joins_on_the_longest_overlap():
    assert new_lines([], ["a", "b"]) == (["a", "b"], True)
    assert new_lines(["a", "b", "c"], ["b", "c", "d", "e"]) == (["d", "e"], True)
    assert new_lines(["a", "b"], ["a", "b"]) == ([], True)
    assert new_lines(["x", "x"], ["x", "x", "y"]) == (["y"], True)  # repeated lines: the longest overlap wins
    assert new_lines(["a", "b"], ["c", "d"]) == (["c", "d"], False)


class _One(App):
    def compose(self) -> ComposeResult:
        yield LogPane(id="log")


async def test_show_replaces_a_half_written_line_marks_a_gap_and_bounds_its_lines():
    app = _One()
    async with app.run_test(size=(60, 20)) as pilot:
        pane = app.query_one(LogPane)
        pane.show(0, ["step 1", "step 2 lo"])
        pane.show(0, ["step 1", "step 2 loss 7.1", "step 3"])
        assert pane.lines == ["step 1", "step 2 loss 7.1", "step 3"]
        pane.show(0, ["unrelated"])  # more lines came between two looks than one look reads
        assert pane.lines[-2:] == [SKIPPED, "unrelated"]
        pane.show(0, [])  # an empty read (node unreachable for a moment) keeps what is shown
        assert pane.lines[-1] == "unrelated"
        pane.show(1, ["node 1 says"])  # another node: its own lines only
        assert pane.lines == ["node 1 says"]
        pane.show(1, ["node 1 says"] + [f"line {i}" for i in range(KEEP + 50)])
        await pilot.pause()
        assert len(pane.lines) == KEEP and pane.lines[-1] == f"line {KEEP + 49}"


async def test_lines_that_arrive_before_the_last_scroll_to_the_tail_ran_leave_the_pane_following():
    """On a loaded machine the next tail often comes after the new lines are laid out but before the scroll to
    their end has run: the pane must go on following (it once stopped there for good), yet a scroll up by the user
    in that moment stands."""
    import asyncio

    app = _One()
    async with app.run_test(size=(60, 12)) as pilot:
        pane = app.query_one(LogPane)
        lines: list[str] = []
        for i in range(60):
            lines += [f"line {i}.{j}" for j in range(3)]
            pane.show(0, lines[-50:])
            for _ in range(i % 4):  # updates at every point of the refresh and its callbacks
                await asyncio.sleep(0)
            assert pane.following, (i, pane.scroll_target_y, pane.max_scroll_y)
        await pilot.pause()
        await pilot.pause()
        assert pane.max_scroll_y > 0 and pane.scroll_y == pane.max_scroll_y

        lines += ["more"]
        pane.show(0, lines[-50:])
        pane.scroll_home(animate=False, immediate=True)  # the user scrolls up before the scroll to the end runs
        assert not pane.following
        await pilot.pause()
        await pilot.pause()
        lines += ["and more"]
        pane.show(0, lines[-50:])
        await pilot.pause()
        assert pane.scroll_y == 0 and not pane.following
