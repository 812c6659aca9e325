"""The advice list: one row per finding, coloured by level; Enter (or F8 on the
first fixable one) applies its fix."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from ...advice import Advice

_STYLE = {"error": ("✘", "bold red"), "warning": ("!", "yellow"), "info": ("i", "cyan")}


def advice_text(a: Advice) -> Text:
    mark, style = _STYLE.get(a.level, ("·", ""))
    t = Text()
    t.append(f"{mark} {a.code} ", style=style)
    t.append(a.message)
    if a.fix is not None:
        t.append(f"\n   fix: {a.fix.label}", style="dim italic")
    return t


class AdviceList(OptionList):
    def show(self, items: list[Advice]) -> None:
        self.items = list(items)
        self.clear_options()
        if not items:
            self.add_option(Option(Text("✔ no warnings", style="green"), id="none", disabled=True))
            return
        self.add_options([Option(advice_text(a), id=f"a{i}") for i, a in enumerate(items)])
