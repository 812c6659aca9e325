"""The Run screen's log pane: one node's log tail, long lines wrapped to the pane's width (a
300-character traceback line is read without scrolling sideways), following the tail as lines
arrive until the user scrolls up, then staying where they are, as a log viewer does.

Each update brings the node's last lines (run.api.Snapshot.log); only the lines not shown yet
are appended, so a user who scrolled up keeps their place. The pane holds a bounded number of
lines (more while the user reads back), and its text is one Static: cheap to refresh each second."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

KEEP = 400  # lines held while following the tail
KEEP_READING = 2000  # while the user reads back: the lines under them are not dropped so soon
SKIPPED = "… (lines skipped: more arrived between two looks than one look reads)"


def new_lines(shown: list[str], tail: list[str]) -> tuple[list[str], bool]:
    """The lines of `tail` (a log's last lines) that come after what `shown` already ends with, and
    whether they join on (False: nothing in `tail` overlaps `shown`, so lines may have been missed)."""
    if not shown:
        return list(tail), True
    for k in range(min(len(shown), len(tail)), 0, -1):
        if shown[-k:] == tail[:k]:
            return tail[k:], True
    return list(tail), False


class LogPane(VerticalScroll, can_focus=True):
    DEFAULT_CSS = """
    LogPane { overflow-x: hidden; }
    LogPane > #log-text { width: 100%; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.rank: int | None = None
        self.lines: list[str] = []
        # Where the scroll was going when the pane last followed the tail: until the user scrolls above it, the pane
        # follows, even while new lines are laid out before the scroll to their end has run (on a loaded machine
        # the next tail often comes first, and a pane that looked only at the end then stopped following for good).
        self._tail_from: float | None = 0.0

    def compose(self) -> ComposeResult:
        yield Static(id="log-text")

    @property
    def following(self) -> bool:
        """At the tail: not scrolled up by the user. (Not textual's anchor(): it pins a short log to the
        pane's bottom edge, leaving the space above it empty.)"""
        # where a scroll is going counts: End pressed a moment ago is at the tail even while it animates
        target = self.scroll_target_y
        return target >= self.max_scroll_y or (self._tail_from is not None and target >= self._tail_from)

    def _to_tail(self) -> None:
        """Scroll to the end as it is laid out now, and follow from there."""
        self.scroll_end(animate=False, immediate=True)
        self._tail_from = self.scroll_target_y

    def clear(self) -> None:
        """A new run: nothing of the last one's log stays."""
        self.rank, self.lines, self._tail_from = None, [], 0.0
        self.query_one("#log-text", Static).update("")
        self.scroll_home(animate=False)

    def show(self, rank: int | None, tail: list[str]) -> None:
        """The latest tail of node `rank`'s log: a new node starts afresh at the bottom."""
        if rank != self.rank:
            self.rank, self.lines = rank, []
            self.query_one("#log-text", Static).update("")
            self.scroll_home(animate=False)
            self._tail_from = 0.0
        if not tail:  # nothing read this time (a node gone for a moment): keep what is shown
            return
        # the last line shown may have been caught half-written: it is always taken again from the tail
        follow = self.following  # before the new lines change the height
        self._tail_from = self.scroll_target_y if follow else None
        base = self.lines[:-1]
        add, joined = new_lines(base, tail)
        lines = base + ([] if joined else [SKIPPED]) + add
        del lines[:-(KEEP if follow else KEEP_READING)]
        if lines == self.lines:
            return
        self.lines = lines
        self.query_one("#log-text", Static).update(self._text())
        if follow:  # once the new height is laid out (on_resize hears the layout itself, where this comes early)
            self.call_after_refresh(self.on_resize)

    def on_resize(self) -> None:
        # new lines laid out, or a narrower pane that wraps into more rows: a pane that followed the tail goes on
        # following it (unless the user has scrolled up meanwhile)
        if self.following:
            self._to_tail()

    def _text(self) -> Text:
        # a log's colours arrive as ANSI codes; a word longer than the width (a path) folds
        return Text.from_ansi("\n".join(self.lines), no_wrap=False, overflow="fold")
