"""Whether each node can be read, decided over time and never from one failed read.

A read of a node (its exit-code file, its job's processes, the master's metrics, the heartbeats) that
raises or does not answer makes the node *unreachable*: its training goes on, the monitor retries with
backoff (after dropping the SSH connection, so that the retry connects anew), and the faces say so. The
node is reachable again at its next good read. It is given up on only past `bound` seconds of being
unreachable, and then only when the preset says so (monitor.on_unreachable: stop); a job confirmed gone,
or a training failure, is the launcher's to decide, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .notices import GIVEN_UP, REACHABLE, UNREACHABLE, Notice

# Retry delays after the 1st, 2nd, ... failed read in a row: quick first (a dropped packet), then at most
# every 10 s (each try of an unreachable node costs a connect timeout on a thread of its own).
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 10.0)
# A read still unanswered after this long makes its node unreachable while it goes on (each read carries
# its own bound, 15 s by default; the faces should not wait that long to say so).
SILENT_S = 8.0


def backoff(failures: int) -> float:
    return BACKOFF_S[min(max(failures, 1), len(BACKOFF_S)) - 1]


@dataclass
class Reach:
    since: float | None = None  # monotonic time of the first failed read of this episode
    failures: int = 0  # failed reads in a row
    last_error: str = ""
    next_try: float = 0.0
    given_up: bool = False
    episodes: int = 0  # how many times the node was unreachable in this run
    last_failed_read: float | None = None  # when the last failed read began


@dataclass
class Health:
    """Reachability of every node of one attempt. `say(notice)` gets each change as it happens."""

    labels: dict[int, str]
    bound: float = 120.0
    on_bound: str = "stop"  # stop | keep
    say: Callable[[Notice], None] = lambda n: None
    attempt: int = 1
    clock: Callable[[], float] = time.monotonic
    nodes: dict[int, Reach] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.nodes = {r: Reach() for r in self.labels}

    def _name(self, rank: int) -> str:
        return f"node {rank} ({self.labels.get(rank, '?')})"

    def due(self, rank: int) -> bool:
        """Whether a read of the node should be tried now: always while it is reachable; after a backoff while
        it is not, and at once when the bound has passed and no read since has failed (the last word before
        giving up is a fresh read, not one tried seconds before the link came back)."""
        r = self.nodes[rank]
        if r.since is not None and not r.given_up and self.clock() - r.since > self.bound and \
                (r.last_failed_read or 0.0) - r.since <= self.bound:
            return True
        return self.clock() >= r.next_try

    def unreachable(self, rank: int) -> bool:
        return self.nodes[rank].since is not None

    def seconds_unreachable(self, rank: int) -> float:
        since = self.nodes[rank].since
        return 0.0 if since is None else self.clock() - since

    def ok(self, rank: int) -> None:
        r = self.nodes[rank]
        if r.since is not None:
            gone = self.clock() - r.since
            self.say(Notice(REACHABLE, f"{self._name(rank)} reachable again after {gone:.0f} s; nothing was "
                            "missed (its log and metrics are read on from where they stopped)", rank,
                            attempt=self.attempt, details={"seconds": round(gone, 1)}))
        r.since, r.failures, r.last_error, r.next_try, r.given_up = None, 0, "", 0.0, False

    def failed(self, rank: int, error: str, *, started: float | None = None) -> None:
        """A read of the node raised, or (started: when it began) has not answered for SILENT_S."""
        r = self.nodes[rank]
        now = self.clock()
        r.failures += 1
        r.last_error = error
        r.next_try = now + backoff(r.failures)
        r.last_failed_read = started if started is not None else now
        if r.since is None:
            r.since = started if started is not None else now
            r.episodes += 1
            self.say(Notice(UNREACHABLE, f"{self._name(rank)} unreachable: {error}; training goes on, "
                            f"retrying (given up after {self.bound:g} s: monitor.unreachable_timeout)", rank,
                            attempt=self.attempt, details={"error": error}))

    def note(self, rank: int) -> str | None:
        """What a face shows beside the node while it is unreachable."""
        r = self.nodes[rank]
        if r.since is None:
            return None
        what = "given up" if r.given_up and self.on_bound == "stop" else "training goes on"
        return f"unreachable for {self.clock() - r.since:.0f} s; {what} ({r.last_error})"

    def past_bound(self) -> list[int]:
        """Nodes unreachable for longer than the bound, said once each episode; the launcher acts on them
        when on_bound is stop (with keep, they are only said)."""
        out = []
        for rank, r in self.nodes.items():
            if r.since is None or r.given_up or self.clock() - r.since <= self.bound:
                continue
            if (r.last_failed_read or 0.0) - r.since <= self.bound:
                continue  # no read begun past the bound has failed yet: one is tried first (due)
            r.given_up = True
            act = ("every node is stopped (monitor.on_unreachable: stop)" if self.on_bound == "stop" else
                   "training goes on and qwen-tui keeps trying (monitor.on_unreachable: keep)")
            self.say(Notice(GIVEN_UP, f"{self._name(rank)} unreachable for more than {self.bound:g} s "
                            f"({r.last_error}); {act}", rank, attempt=self.attempt,
                            details={"error": r.last_error, "bound": self.bound}))
            out.append(rank)
        return out
