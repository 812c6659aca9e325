"""The header every step shows: where you are, and which steps are still red.
In a narrow terminal it drops words, never a step: the title shrinks to the preset's
name, then each step to its key and a short name (100 columns keep all six)."""

from __future__ import annotations

from rich.text import Text
from textual.events import Resize
from textual.widgets import Static

from ...wizard.state import STEPS, TITLES
from ..styles import STEP, tone

SHORT = {"nodes": "Nodes", "ssh": "SSH", "network": "Net", "training": "Train", "review": "Review", "run": "Run"}


def stepper_text(current: str, statuses: dict[str, str], title: str, short: bool) -> Text:
    t = Text()
    if title:
        t.append(f" {title} ", style="bold reverse")
        t.append(" " if short else "  ")
    for i, step in enumerate(STEPS):
        mark, colour = STEP.get(statuses.get(step, ""), ("·", "dim"))
        label = f"F{i + 1} {SHORT[step]}{mark}" if short else f" F{i + 1} {TITLES[step]} {mark} "
        style = tone(f"bold {colour} reverse" if step == current else colour)
        t.append(label, style=style)
        if i < len(STEPS) - 1:
            t.append(" " if short else "›", style="dim")
    return t


class Stepper(Static):
    _last: tuple[str, dict[str, str], str] | None = None

    def show(self, current: str, statuses: dict[str, str], title: str = "", width: int | None = None) -> None:
        self._last = (current, dict(statuses), title)
        width = width or self.app.size.width
        short_title = title.removeprefix("qwen-tui · ")
        for text in (stepper_text(current, statuses, title, False),
                     stepper_text(current, statuses, short_title, False),
                     stepper_text(current, statuses, short_title, True)):
            if text.cell_len <= width:
                break
        else:  # narrower still: every step before the title
            text = stepper_text(current, statuses, "", True)
            text.append(f" {short_title}", style="bold")
        self.update(text)

    def show_again(self, width: int) -> None:
        """The terminal is `width` columns now."""
        if self._last is not None:
            self.show(*self._last, width=width)

    def on_resize(self, _: Resize) -> None:
        if self._last is not None:
            self.show(*self._last)
