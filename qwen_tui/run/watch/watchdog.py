"""The hang watchdog: when no step finishes within a bound, name the rank that holds the run.

Every rank of the worker writes a heartbeat (training/runtime/heartbeat.py: its step, the phase it is in and
since when, written every couple of seconds by a thread of its own). The launcher reads them from every
node (read_heartbeats) and feeds them here. A run is hung when the highest step any rank has finished
stays the same for `bound` seconds: the preset's monitor.hang_timeout, else 5 x the median step time and
at least 120 s, ten times that (at least 600 s) while most ranks save a checkpoint or evaluate. Before the
first step no hang is called: loading a large model takes as long as it takes.

The culprit, in this order of evidence:
1. a rank whose heartbeat stopped changing while the others' go on: the process is stopped, frozen or
   swapping (its writer thread cannot run);
2. a rank behind the others' step;
3. a rank in another phase than most (the others wait in a collective for it);
4. the rank that entered the common phase first.
Every observation is in the monitor's own clock: nodes' clocks may disagree by seconds.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ...nodes.programs import program

MIN_BOUND_S = 120.0
STEP_FACTOR = 5.0
SLOW_PHASES = ("checkpoint", "eval")  # phases that may rightly take many steps' time
SLOW_FACTOR, SLOW_MIN_S = 10.0, 600.0
STALE_MIN_S = 10.0  # a heartbeat unchanged this long (and 3 write intervals) counts as stopped

# One round trip per node: every rank's heartbeat file as one line each (a file being replaced is skipped).
READ_BEATS = program("read_beats.sh")


def parse_beats(text: str) -> dict[int, dict]:
    """global rank -> heartbeat, from READ_BEATS' output; lines that are not heartbeats are skipped."""
    out: dict[int, dict] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            b = json.loads(line)
        except ValueError:
            continue
        if isinstance(b, dict) and type(b.get("rank")) is int and isinstance(b.get("step"), int):
            out[b["rank"]] = b
    return out


def own_beats(beats: dict[int, dict], node: int) -> dict[int, dict]:
    """The heartbeats of node `node`'s own ranks among those read in its heartbeat directory: nodes that share a
    workdir (two agents on one machine, or shared storage) share that directory, and another node's ranks read there
    are neither this node's culprits nor its processes to signal. A heartbeat without a node rank is kept."""
    return {r: b for r, b in beats.items() if type(b.get("node_rank")) is not int or b["node_rank"] == node}


@dataclass(frozen=True)
class HangVerdict:
    culprits: list[int]  # global ranks
    node: int | None  # node rank of the first culprit (its heartbeat's node_rank)
    phase: str
    reason: str
    stalled_for: float
    bound: float
    step: int

    def text(self, labels: dict[int, str]) -> str:
        where = f"node {self.node} ({labels.get(self.node, '?')})" if self.node is not None else "an unknown node"
        ranks = ", ".join(str(r) for r in self.culprits)
        return (f"HANG: no step finished for {self.stalled_for:.0f} s (bound {self.bound:.0f} s) after step "
                f"{self.step}; {where}, rank {ranks}, in phase {self.phase}: {self.reason}")


@dataclass
class HangWatch:
    bound_s: float | None = None  # monitor.hang_timeout; None: from the run's own step times
    clock: Callable[[], float] = time.monotonic
    best_step: int = -1
    progress_at: float = field(default=0.0)
    fired: bool = False
    _seen: dict[int, tuple[float, float]] = field(default_factory=dict)  # rank -> (its `time`, when it changed)

    def __post_init__(self) -> None:
        self.progress_at = self.clock()

    def bound(self, step_times: list[float], phases: list[str]) -> float:
        if self.bound_s is not None:
            b = float(self.bound_s)
        else:
            recent = [t for t in step_times[-50:] if isinstance(t, (int, float)) and t > 0]
            b = max(MIN_BOUND_S, STEP_FACTOR * statistics.median(recent)) if recent else MIN_BOUND_S
        if phases and Counter(phases).most_common(1)[0][0] in SLOW_PHASES:
            b = max(b * SLOW_FACTOR, SLOW_MIN_S)
        return b

    def observe(self, beats: dict[int, dict], step_times: list[float]) -> HangVerdict | None:
        """Feed the heartbeats read now; a HangVerdict the first time the run is found hung (once per stall)."""
        now = self.clock()
        for r, b in beats.items():
            t = b.get("time")
            old = self._seen.get(r)
            if old is None or old[0] != t:
                self._seen[r] = (t, now)
        if not beats:
            return None
        phases = [str(b.get("phase", "?")) for b in beats.values()]
        top = max(b["step"] for b in beats.values())
        if top > self.best_step:
            self.best_step, self.progress_at, self.fired = top, now, False
            return None
        if all(p in ("start", "done") for p in phases):
            self.progress_at = now  # not started yet, or finished: nothing can hang
            return None
        bound = self.bound(step_times, phases)
        if self._stale(beats, now) and len(self._stale(beats, now)) < len(beats):
            # a stopped process is no slow checkpoint: the others wait for it whatever phase they are in
            bound = self.bound(step_times, [])
        stalled = now - self.progress_at
        if self.fired or stalled <= bound:
            return None
        self.fired = True
        culprits, reason = self._culprits(beats, now)
        first = beats[culprits[0]]
        node = first.get("node_rank")
        return HangVerdict(culprits, node if type(node) is int else None, str(first.get("phase", "?")), reason,
                           stalled, bound, top)

    def progressing_again(self, beats: dict[int, dict]) -> bool:
        """After a verdict: whether a step has finished since (the hang was not one, or it cleared)."""
        return bool(beats) and max(b["step"] for b in beats.values()) > self.best_step

    def _stale(self, beats: dict[int, dict], now: float) -> list[int]:
        """Ranks whose heartbeat has not changed for STALE_MIN_S (and 3 write intervals) of the monitor's clock."""
        interval = max((float(b.get("interval", 2.0) or 2.0) for b in beats.values()), default=2.0)
        stale_after = max(STALE_MIN_S, 3 * interval)
        return sorted(r for r in beats if now - self._seen[r][1] > stale_after)

    def _culprits(self, beats: dict[int, dict], now: float) -> tuple[list[int], str]:
        ages = {r: now - self._seen[r][1] for r in beats}
        stale = self._stale(beats, now)
        if stale and len(stale) < len(beats):
            return stale, (f"its heartbeat stopped {max(ages[r] for r in stale):.0f} s ago while the other ranks' "
                           "go on: the process is stopped, frozen or swapping")
        low = min(b["step"] for b in beats.values())
        behind = sorted(r for r, b in beats.items() if b["step"] == low)
        if len(behind) < len(beats):
            return behind, f"it is at step {low} while the others finished step {max(b['step'] for b in beats.values())}"
        phases = Counter(str(b.get("phase", "?")) for b in beats.values())
        common = phases.most_common(1)[0][0]
        odd = sorted(r for r, b in beats.items() if str(b.get("phase", "?")) != common)
        if odd and len(odd) < len(beats):
            return odd, f"the other ranks wait in phase {common} for it"
        if stale:  # every heartbeat stopped: every node's processes stopped, or every node unreadable
            return stale, "no rank's heartbeat changes: every process is stopped or frozen"
        first = min(beats, key=lambda r: float(beats[r].get("phase_since") or 0.0))
        return [first], f"every rank is in phase {common}; this one entered it first"
