"""The advice list: one row per finding, coloured by level; Enter (or F8 on the
first fixable one) applies its fix."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from ...advice.rules import Advice
from ..styles import GOOD, WARNING, level_style, tone


def advice_text(a: Advice) -> Text:
    t = Text()
    t.append(f"{a.level.mark} {a.code} ", style=level_style(a.level))
    t.append(a.message)
    if a.fix is not None:
        t.append(f"\n   fix: {a.fix.label}", style="dim italic")
    return t


class AdviceList(OptionList):
    items: list[Advice] = []

    @property
    def selected(self):
        """The highlighted item, or None."""
        i = self.highlighted
        return self.items[i] if i is not None and i < len(self.items) else None

    def show(self, items: list[Advice], *, gpu_unknown: bool = False) -> None:
        """Redraw; the highlighted finding stays highlighted (by code) when it is still there."""
        was = self.selected
        self.items = list(items)
        self.clear_options()
        if not items:
            text = (Text("! no warnings, but GPU unknown: memory fit not checked", style=tone(WARNING)) if gpu_unknown
                    else Text("✔ no warnings", style=tone(GOOD)))
            self.add_option(Option(text, id="none", disabled=True))
            return
        self.add_options([Option(advice_text(a), id=f"a{i}") for i, a in enumerate(items)])
        if was is not None:
            same = next((i for i, a in enumerate(items) if (a.code, a.message) == (was.code, was.message)), None)
            same = same if same is not None else next((i for i, a in enumerate(items) if a.code == was.code), None)
            if same is not None:
                self.highlighted = same
