"""The header every step shows: where you are, and which steps are still red."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ...wizard_state import BAD, OK, STEPS, TITLES, WARN

_MARK = {OK: ("✔", "green"), WARN: ("!", "yellow"), BAD: ("✘", "bold red")}


class Stepper(Static):
    def show(self, current: str, statuses: dict[str, str], title: str = "") -> None:
        t = Text()
        if title:
            t.append(f" {title} ", style="bold reverse")
            t.append("  ")
        for i, step in enumerate(STEPS):
            mark, colour = _MARK.get(statuses.get(step, ""), ("·", "dim"))
            label = f" F{i + 1} {TITLES[step]} {mark} "
            style = f"bold {colour} reverse" if step == current else colour
            t.append(label, style=style)
            if i < len(STEPS) - 1:
                t.append("›", style="dim")
        self.update(t)
