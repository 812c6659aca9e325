"""The Training step's data preview: records, token lengths as bars, the supervised share and the time per
epoch, from the data preview (run by the screen in a worker; this widget only draws what it is given)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from ...advice.datapreview import histogram_lines, summary_lines
from ..styles import ERROR, NOTE, WARNING_STRONG, level_style, tone

HINT = "F9 previews the data: tokenized on the master with the model's own chat template, as the worker will"
BINS = 8


class DataPanel(Static):
    """Empty (a hint), running, a report, or an error."""

    def on_mount(self) -> None:
        self.show_hint()

    def show_hint(self) -> None:
        self.report: dict[str, Any] | None = None
        self.update(Text(HINT, style="dim"))

    def show_running(self) -> None:
        self.update(Text("tokenizing the data on the master…", style="italic"))

    def show_error(self, message: str) -> None:
        self.report = None
        self.update(Text(f"✘ {message}", style=tone(ERROR)))

    def show_report(self, report: dict[str, Any], stale: bool = False) -> None:
        self.report = report
        parts: list[Any] = []
        if stale:
            parts.append(Text("the preset changed since: F9 to preview again", style=tone(WARNING_STRONG)))
        parts += [Text(line) for line in summary_lines(report)]
        parts += [Text(line, style=tone(NOTE)) for line in histogram_lines(report["histogram"], width=24,
                                                                     max_length=report["model_max_length"])]
        for a in report["advice"]:
            t = Text(f"{a['code']} ", style=level_style(a["level"]))
            t.append(a["message"])
            if a["fix"]:
                t.append(f"\n   fix: {a['fix']['label']}" + (f"; {a['fix']['hint']}" if a["fix"]["hint"] else ""),
                         style="dim italic")
            parts.append(t)
        self.update(Group(*parts))
