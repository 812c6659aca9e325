"""One node of the Run screen: status, and per GPU utilisation and memory (CPU load
on a CPU-only node)."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from ...run.states import JobState
from ...run.watch.gpumon import NodeSample
from ..styles import FAIL, GOOD, JOB, MEMORY, NOTE, WARNING, tone
from .bars import bar


class GpuPanel(Static):
    def __init__(self, rank: int, label: str, **kw) -> None:
        super().__init__(**kw)
        self.rank, self.label = rank, label
        self.sample: NodeSample | None = None
        self.status: JobState = JobState.PENDING
        self.error: str | None = None
        self.note: str | None = None  # where its stop is, while the run stops
        self.ended = False  # the run is over: no sample describes the node any more
        self.border_title = f"node {rank}: {label}"

    def set_sample(self, s: NodeSample) -> None:
        if self.ended:  # a sample taken before the end, arriving after it
            return
        self.sample = s
        self._redraw()

    def end(self, status: JobState) -> None:
        """The run ended: its outcome, and no last sample that would read as the node's load now."""
        self.ended, self.sample = True, None
        self.set_status(status, self.error)

    def set_status(self, status: JobState, error: str | None, note: str | None = None) -> None:
        self.status, self.error, self.note = JobState(status), error, note
        self.set_class(status in (JobState.FAILED, JobState.LOST), "-failed")
        self._redraw()

    def _redraw(self) -> None:
        rows: list = []
        head = Text()
        head.append(self.status, style=tone(JOB.get(self.status, "")))
        if self.note:
            head.append(f": {self.note}", style=tone(WARNING))
        rows.append(head)
        if self.error:
            rows.append(Text(self.error[-300:], style=tone(FAIL)))
        s = self.sample
        if s is None and self.ended:
            rows.append(Text("not watched: the run has ended", style="dim"))
        elif s is None:
            rows.append(Text("waiting for the first sample…", style="dim"))
        elif s.error and not s.gpus:
            rows.append(Text(f"monitor: {s.error}", style=tone(WARNING)))
        elif s.gpus:
            for g in s.gpus:
                util = None if g.util_pct is None else g.util_pct / 100
                line = Text(f"GPU{g.index} ")
                line.append_text(bar(util, 10, GOOD))
                line.append(f" {g.util_pct or 0:3.0f}%  mem ")
                line.append_text(bar(g.mem_fraction, 10, MEMORY))
                used = (g.mem_used_mib or 0) / 1024
                total = (g.mem_total_mib or 0) / 1024
                line.append(f" {used:5.1f}/{total:.0f} GiB")
                rows.append(line)
        else:
            line = Text("CPU  ")
            util = None if s.cpu_util_pct is None else s.cpu_util_pct / 100
            line.append_text(bar(util, 14, NOTE))
            line.append(f" {s.cpu_util_pct or 0:3.0f}%")
            rows.append(line)
            rows.append(Text(f"load {s.load1:.2f} on {s.cpu_count} cores (no GPU)", style="dim"))
        self.update(Group(*rows))
