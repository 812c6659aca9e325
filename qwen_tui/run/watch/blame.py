"""Which node made a run fail when a machine goes: blame from evidence across nodes, never from one node's log.

When a machine crashes, reboots or drops off the network, its own processes leave no exit code and its log cannot be
read, while every other node's ranks fail a moment later with communication errors (a connection reset, a collective
that timed out): the survivors' logs are consequences, not causes. Two pieces of evidence name the machine:

- the survivors failed with communication errors (cluster/failures.py: CONSEQUENTIAL) while one node stopped
  answering over SSH: that node is the cause (`machine_lost_in`), and it is LOST at once;
- a node stopped answering over SSH and the other nodes' ranks, alive (their heartbeats go on), have all held one
  phase for a stall bound by their own clocks (`peer_stall`): they wait for a peer that will never answer, so its
  training peers lost it too and it is LOST at once, not after monitor.unreachable_timeout. An SSH cut alone never
  looks like this: training goes on through it and the ranks move through their phases every step.

A node whose survivors failed with communication errors but which nobody can yet tell apart (every other node
still answers and runs) is waited for a few seconds (CAUSE_GRACE_S) before the first failed node is blamed: the
machine that went away shows itself as unreachable within that time. Pure: the launcher and the monitor feed it.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ...cluster.failures import Diagnosis

MACHINE_LOST = "MACHINE_LOST"
# How long survivors that failed only with communication errors wait for the node that caused them to show itself
# (a node that went away is unreachable at its next read: a look every half second, a refused connection at once,
# a silent one after nodes/transport/ssh.py's connect timeout or health.SILENT_S).
CAUSE_GRACE_S = 12.0
# Peers that lost a node finish no step for this long (at least), or 5 step times, since it stopped answering.
STALL_MIN_S = 10.0
STALL_STEPS = 5.0
# While most ranks save a checkpoint or evaluate, steps rightly pause for long: the stall bound grows as the hang
# watchdog's does (run/watch/watchdog.py).
SLOW_PHASES = ("checkpoint", "eval")
SLOW_FACTOR, SLOW_MIN_S = 10.0, 600.0

CAUSE = "the machine went away (crashed, rebooted, or cut off from the network): its processes left no exit code"
FIX = ("check that machine (power, `journalctl -k` or the BMC's log, its network link); with training.restarts and "
       "training.exclude_failed the run relaunches without it from the last complete checkpoint")

_IPV4 = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.])")


def machine_lost(evidence: str) -> Diagnosis:
    """The diagnosis of a machine that went away; its `line` is the whole evidence (the failure summary shows it)."""
    return Diagnosis(MACHINE_LOST, CAUSE, FIX, evidence)


def addresses_in(text: str) -> list[str]:
    """The IPv4 addresses a log line names (gloo and NCCL name the peer they lost: `[10.0.0.2]:45321`)."""
    return _IPV4.findall(text)


def node_of_address(addr: str, addresses: Mapping[int, Iterable[str]]) -> int | None:
    """The node whose addresses (plan host, probed interfaces) include `addr`, if exactly one does."""
    found = [n for n, addrs in addresses.items() if addr in set(addrs)]
    return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class Survivor:
    """A node that failed with communication errors only: what its log said."""

    node: int
    label: str
    line: str  # the log line that matched (connection reset, collective timeout, ...)


def evidence_line(lost: int, label: str, ssh_error: str, seconds: float, survivors: list[Survivor],
                  addresses: Mapping[int, Iterable[str]]) -> str:
    """One paragraph of evidence for a failure summary: why `lost` is blamed and no survivor."""
    parts = [f"node {lost} ({label}) stopped answering over SSH {seconds:.0f} s ago ({ssh_error or 'no answer'})"]
    for s in survivors:
        named = [a for a in addresses_in(s.line) if node_of_address(a, addresses) == lost]
        towards = f", naming node {lost}'s address {named[0]}" if named else ""
        parts.append(f"node {s.node} ({s.label}) failed with a communication error{towards}: {s.line.strip()[:200]}")
    return "; ".join(parts)


def pick_lost(unreachable: Mapping[int, float]) -> int | None:
    """Of the nodes unreachable now (node -> seconds unreachable), the one that went first."""
    if not unreachable:
        return None
    return max(unreachable, key=lambda n: (unreachable[n], -n))


def stall_bound(step_times: list, phases: list[str], saves: list | None = None) -> float:
    """How long the peers of a silent node may hold their phase before they are taken to have lost it. In a
    checkpoint: 5 times the longest save this run has made (the worker logs each one's seconds), else the hang
    watchdog's long bound for slow phases (a first save of a large model takes what it takes)."""
    recent = [t for t in step_times[-50:] if isinstance(t, (int, float)) and t > 0]
    b = max(STALL_MIN_S, STALL_STEPS * statistics.median(recent)) if recent else STALL_MIN_S
    common = max(set(phases), key=phases.count) if phases else None
    took = [s for s in saves or [] if isinstance(s, (int, float)) and s >= 0]
    if common == "checkpoint" and took:
        b = max(b, STALL_STEPS * max(took))
    elif common in SLOW_PHASES:
        b = max(b * SLOW_FACTOR, SLOW_MIN_S)
    return b


@dataclass(frozen=True)
class PeerStall:
    """A silent node whose peers lost it: the node, how long it has been unreachable, how long no step finished."""

    node: int
    unreachable_s: float
    stalled_s: float
    bound_s: float
    waiting: str  # the alive ranks and their phases, for the notice

    def text(self, label: str, ssh_error: str) -> str:
        return (f"node {self.node} ({label}) lost: unreachable over SSH for {self.unreachable_s:.0f} s "
                f"({ssh_error or 'no answer'}) and its training peers lost it too: no step finished for "
                f"{self.stalled_s:.0f} s (bound {self.bound_s:.0f} s): {self.waiting}")


def peer_stall(*, now: float, unreachable_since: Mapping[int, float], alive: Mapping[int, tuple[str, float]],
               step_times: list, nodes: int, saves: list | None = None) -> PeerStall | None:
    """A node unreachable while the others, alive, finish no step (module docstring), or None.

    unreachable_since: node -> monotonic time it went unreachable (running nodes only); alive: rank of a reachable
    node whose heartbeat still changes (a process that runs) -> (its phase, how long it has been in it by its own
    heartbeat: `time - phase_since`, one node's clock, so no skew between nodes counts); nodes: how many nodes the
    attempt has; saves: the seconds each checkpoint of the run took. A rank that waits for a peer that will never
    answer stays in one phase: when every alive rank has held its phase for the stall bound, no step can have
    finished."""
    if nodes < 2 or not unreachable_since or not alive or len(unreachable_since) >= nodes:
        return None
    if any(p in ("start", "done") for p, _ in alive.values()):
        return None  # loading a model or leaving takes as long as it takes: the unreachable bound decides then
    node = min(unreachable_since, key=lambda n: (unreachable_since[n], n))
    bound = stall_bound(step_times, [p for p, _ in alive.values()], saves)
    stalled = min(age for _, age in alive.values())
    if stalled < bound:
        return None
    phases = sorted({p for p, _ in alive.values()})
    waiting = (f"{len(alive)} rank(s) of the other nodes run on (heartbeats fresh), held in phase "
               f"{', '.join(phases)}")
    return PeerStall(node, now - unreachable_since[node], stalled, bound, waiting)
