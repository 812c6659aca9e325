"""The master's loss curve (block plot) with learning rate, tokens/s, step and ETA."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.events import Resize
from textual.widgets import Static

from ...run.watch.metrics import TrainingProgress, fmt_duration
from ..styles import CURVE, NOTE, WARNING, WARNING_STRONG, tone

_BLOCKS = " ▁▂▃▄▅▆▇█"


def spark(values: list[float], width: int) -> str:
    """One-row sparkline of the last `width` values."""
    values = values[-width:]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(_BLOCKS[1 + round((v - lo) / span * 7)] for v in values)


def plot(values: list[float], width: int, height: int) -> list[Text]:
    """Column plot of the last `width` values (resampled by bucket means), `height` rows."""
    if not values:
        return [Text("no loss yet", style="dim")] + [Text("")] * (height - 1)
    if len(values) > width:
        step = len(values) / width
        values = [sum(values[int(i * step):max(int(i * step) + 1, int((i + 1) * step))]) /
                  max(1, len(values[int(i * step):max(int(i * step) + 1, int((i + 1) * step))])) for i in range(width)]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    levels = [round((v - lo) / span * (height * 8 - 1)) + 1 for v in values]
    rows = []
    for r in range(height - 1, -1, -1):
        t = Text()
        for lv in levels:
            t.append(_BLOCKS[max(0, min(8, lv - r * 8))], style=tone(CURVE))
        rows.append(t)
    rows[0] = Text(f"{hi:8.4f} ", style="dim") + rows[0]
    rows[-1] = Text(f"{lo:8.4f} ", style="dim") + rows[-1]
    for i in range(1, len(rows) - 1):
        rows[i] = Text(" " * 9) + rows[i]
    return rows


LABEL_COLUMNS = 10  # the value / "lr" / "eval" labels left of the plot, and a spare column


class LossChart(Static):
    _shown: tuple | None = None

    def show(self, prog: TrainingProgress | None, width: int = 60, height: int = 6, ended: bool = False,
             hung: bool = False) -> None:
        """Draw `prog`; the plot never runs wider than the widget (a terminal made smaller, a 100-column
        one) and is drawn again at the new width on every resize. `hung`: a hang is called now (no ETA)."""
        self._shown = (prog, width, height, ended, hung)
        if self.size.width:
            width = max(10, min(width, self.size.width - LABEL_COLUMNS))
        if prog is None or not prog.steps:
            self.summary = ""
            self.update(Text("waiting for the first logged step…", style="dim"))
            return
        last = prog.last or {}
        total = prog.total_steps
        lr = last.get("learning_rate", last.get("lr"))
        tps = last.get("tokens_per_s", last.get("tokens_per_second"))
        info = Text()
        info.append(f"step {last.get('step')}" + (f"/{total}" if total else ""), style="bold")
        info.append(f"   loss {last.get('loss', float('nan')):.4f}")
        ev = prog.last_eval
        if ev is not None:
            info.append(f"   eval loss {ev['eval_loss']:.4f}", style=tone(WARNING_STRONG))
            info.append(f" (step {ev.get('step', '?')})", style="dim")
        if lr is not None:
            info.append(f"   lr {lr:.2e}")
        if tps is not None:
            info.append(f"   {tps:,.0f} tokens/s")
        if hung:  # no step finishes: a time left from the old pace would be a lie
            info.append("   ETA unknown (hung)", style=tone(WARNING_STRONG))
        elif not ended:  # a run that stopped has no time left to tell
            info.append(f"   ETA {fmt_duration(prog.eta_seconds())}")
        if prog.preference:  # DPO: the rewards, on a line of their own
            info.append("\n" + prog.preference)
        self.summary = info.plain  # what tests and screen readers can check
        lrs = [s.get("learning_rate", s.get("lr")) for s in prog.steps]
        lrs = [v for v in lrs if isinstance(v, (int, float))]
        parts = [info, *plot(prog.losses, width, height)]
        if lrs:
            parts.append(Text("       lr ", style="dim") + Text(spark(lrs, width), style=tone(NOTE)))
        if prog.accuracies:
            parts.append(Text("   reward ", style="dim") + Text(spark(prog.accuracies, width), style=tone(NOTE)))
        evs = [e["eval_loss"] for e in prog.evals]
        if len(evs) > 1:
            parts.append(Text("     eval ", style="dim") + Text(spark(evs, width), style=tone(WARNING)))
        self.update(Group(*parts))

    def on_resize(self, _: Resize) -> None:
        if self._shown is not None:
            prog, _width, height, ended, hung = self._shown
            self.show(prog, self.size.width - LABEL_COLUMNS, height, ended, hung)
