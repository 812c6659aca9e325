"""iperf3 bandwidth per worker, as bars against the 10 Gbit/s line that multi-node
training of big models needs."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ...cluster.facts import ClusterFacts
from ..styles import FAIL, GOOD, tone
from .bars import bar

LINE_GBPS = 10.0


class BandwidthBars(Static):
    def show(self, labels: list[str], facts: ClusterFacts, width: int = 40) -> None:
        t = Table.grid(padding=(0, 1))
        t.add_column(min_width=12)
        t.add_column()
        t.add_column(justify="right", min_width=12)
        scale = max([LINE_GBPS * 2] + [lk.bandwidth_gbps or 0 for lk in facts.links.values()])
        for i, label in enumerate(labels):
            if i == 0:
                continue
            lk = facts.links.get(i)
            bw = lk.bandwidth_gbps if lk else None
            if bw is None:
                why = (lk.bandwidth_error if lk else None) or "not measured"
                t.add_row(f"{label} → master", Text("·" * width, style="dim"), Text(why[:40], style="dim"))
                continue
            colour = GOOD if bw >= LINE_GBPS else FAIL
            t.add_row(f"{label} → master", bar(bw / scale, width, colour, mark=LINE_GBPS / scale),
                      Text(f"{bw:.1f} Gbit/s", style=tone(colour)))
        if len(labels) < 2:
            t.add_row("", Text("one node: no link to measure", style="dim"), "")
        t.add_row("", Text(f"│ = {LINE_GBPS:g} Gbit/s", style="dim"), "")
        self.update(t)
