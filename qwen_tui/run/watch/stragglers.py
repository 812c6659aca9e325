"""Which node holds every step back: each node's compute time per step against the other nodes'.

The worker's metrics record of each logged step carries every rank's compute and wait time per step
(`rank_compute_s`, `rank_wait_s`, `rank_node`: training/runtime/heartbeat.py explains how they are measured).
A node's compute time is its slowest rank's. A node slower than the median of the other nodes by
`threshold` (0.2: 20%) and by at least MIN_GAP_S in `steps` logged records in a row is a straggler; it stops
being one after as many records in a row within the threshold.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

# Below this a gap is the master's own bookkeeping (rank 0 writes the metrics and the log: ~10-20 ms a step on a
# tiny CPU model), not a slow node; on real models a step takes a second or more and 20% of it is far above.
MIN_GAP_S = 0.05


def node_times(rec: dict) -> dict[int, tuple[float, float]] | None:
    """node rank -> (compute s/step, wait s/step) of one metrics record; None when it has no per-rank times."""
    comp, wait, nodes = rec.get("rank_compute_s"), rec.get("rank_wait_s"), rec.get("rank_node")
    if not (isinstance(comp, list) and isinstance(nodes, list) and len(comp) == len(nodes) and comp):
        return None
    if not isinstance(wait, list) or len(wait) != len(comp):
        wait = [0.0] * len(comp)
    out: dict[int, tuple[float, float]] = {}
    for c, w, n in zip(comp, wait, nodes):
        if type(n) is not int or not isinstance(c, (int, float)):
            return None
        w = float(w) if isinstance(w, (int, float)) else 0.0
        old = out.get(n)
        out[n] = (max(old[0], float(c)), max(old[1], w)) if old else (float(c), w)
    return out


@dataclass(frozen=True)
class Straggler:
    node: int
    compute: float  # s/step
    others: float  # the median of the other nodes' compute, s/step
    records: int  # how many logged records in a row

    @property
    def slower(self) -> float:
        return self.compute / self.others - 1.0 if self.others > 0 else 0.0


@dataclass
class StragglerWatch:
    threshold: float = 0.2
    steps: int = 3
    seen: int = 0  # metrics records looked at so far
    _slow: dict[int, int] = field(default_factory=dict)  # node -> slow records in a row
    _fine: dict[int, int] = field(default_factory=dict)  # node (named) -> fine records in a row
    named: set[int] = field(default_factory=set)
    latest: dict[int, tuple[float, float]] = field(default_factory=dict)  # node -> last (compute, wait)

    def feed(self, records: list[dict]) -> tuple[list[Straggler], list[int]]:
        """Look at the records not seen yet: the stragglers named now, and the nodes that stopped being one."""
        new, over = [], []
        for rec in records[self.seen:]:
            times = node_times(rec)
            if not times:
                continue
            self.latest = times
            if len(times) < 2:
                continue
            for n, (c, _) in times.items():
                others = statistics.median(v[0] for m, v in times.items() if m != n)
                slow = others > 0 and c > others * (1 + self.threshold) and c - others >= MIN_GAP_S
                if slow:
                    self._slow[n] = self._slow.get(n, 0) + 1
                    self._fine[n] = 0
                    if n not in self.named and self._slow[n] >= self.steps:
                        self.named.add(n)
                        new.append(Straggler(n, c, others, self._slow[n]))
                else:
                    self._slow[n] = 0
                    if n in self.named:
                        self._fine[n] = self._fine.get(n, 0) + 1
                        if self._fine[n] >= self.steps:
                            self.named.discard(n)
                            over.append(n)
        self.seen = len(records)
        return new, over

    def note(self, node: int) -> str | None:
        """What a face shows beside a node: its compute and wait per step."""
        t = self.latest.get(node)
        if t is None:
            return None
        slow = " (straggler)" if node in self.named else ""
        return f"compute {t[0]:.2f} s/step, waits {t[1]:.2f} s{slow}"
