"""The launcher's eyes on a running job: every read of a node off the follower's thread and bounded, and
what the reads add up to (run/watch/health.py: reachable or not; run/watch/watchdog.py: hung or not, and who holds
the run; run/watch/stragglers.py: which node is slow). What it notices becomes Notices that every face shows.

Each look submits, per node, the reads that are due and not already under way (the node's exit code and
job, its ranks' heartbeats every few seconds; the master's metrics), then waits for them at most
`wait` seconds: a node that does not answer never holds up the view of the others. A read that raises
makes its node unreachable (and drops its connection so that the next try connects anew); a read still
unanswered after SILENT_S does too. Metrics read late are read on from where they stopped: nothing is
skipped.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from ...cluster.facts import ClusterFacts
from ...nodes.jobs import JobRef
from ...nodes.transport.protocol import SessionEnded, Transport
from ...plan.launch import LaunchPlan
from ..rundir import RunDir
from ..states import JobState, RunState
from .blame import MACHINE_LOST, peer_stall
from .evidence import node_evidence
from .health import SILENT_S, Health
from .metrics import MetricsFollower
from .notices import HANG, HANG_OVER, LOST, STRAGGLER, STRAGGLER_OVER, Notice, append_notice, read_notices
from .stacks import collect_node, flight_recorder
from .stragglers import StragglerWatch
from .watchdog import READ_BEATS, HangVerdict, HangWatch, own_beats, parse_beats


class Attempt(Protocol):
    """A launcher's attempt as its readers see it (run/launcher.py): this monitor, and the culprit search."""

    plan: LaunchPlan
    nodes: dict[int, Any]  # rank -> launcher.NodeState
    transports: dict[int, Transport]
    run_dir: RunDir
    attempt: int


class Watched(Attempt, Protocol):
    """What the monitor reads of the launcher that owns it."""

    metrics: MetricsFollower

    def _ref(self, rank: int) -> JobRef | None: ...

log = logging.getLogger(__name__)

POLL_WAIT_S = 2.0  # the longest one look waits for the nodes' answers
BEATS_EVERY_S = 5.0  # heartbeats are written every 2 s; reading them this often is enough for a bound of minutes
STACKS_BOUND_S = 40.0  # collecting every node's stacks, all nodes in parallel


class RunMonitor:
    def __init__(self, la: Watched) -> None:
        self.la = la
        m = la.plan.monitor or {}
        labels = {c.rank: c.label for c in la.plan.nodes}
        self.labels = labels
        self.notices: list[Notice] = []
        self._lock = threading.Lock()
        self.health = Health(labels, bound=float(m.get("unreachable_timeout", 120)),
                             on_bound=str(m.get("on_unreachable", "stop")), say=self.say, attempt=la.attempt)
        hb = m.get("hang_timeout")
        self.hang = HangWatch(bound_s=float(hb) if isinstance(hb, (int, float)) else None)
        self.on_hang = str(m.get("on_hang", "alert"))
        self.stragglers = StragglerWatch(threshold=float(m.get("straggler_threshold", 0.2)),
                                         steps=int(m.get("straggler_steps", 3)))
        self.beats: dict[int, dict[int, dict]] = {}  # node -> global rank -> heartbeat
        self.verdict: HangVerdict | None = None
        self.lost_evidence: dict[int, str] = {}  # node -> why it is taken for a machine lost (run/watch/blame.py)
        self.hang_action: str | None = None  # "stop" or "restart": the launcher ends the attempt
        self._pool: ThreadPoolExecutor | None = None  # made at the first read, let go when the attempt ends
        self._inflight: dict[str, tuple[Future, float, int]] = {}  # key -> (future, started, node)
        self._silent: set[str] = set()  # reads already counted as unanswered
        self._beats_due = 0.0
        self._evidence: dict[int, Future] = {}
        self._pending_stragglers: dict[int, object] = {}

    # ------------------------------------------------------------ notices
    def say(self, n: Notice) -> None:
        with self._lock:
            self.notices.append(n)
        try:
            append_notice(self.la.run_dir.path, n)
        except OSError as e:  # the run directory is the master's disk: a full disk must not stop the watch
            log.warning("cannot record a notice in %s: %s", self.la.run_dir.path, e)
        log.info("%s", n.text)

    def earlier(self) -> None:
        """Notices recorded before this view began (attach): shown as they were."""
        with self._lock:
            self.notices[:0] = [n for n in read_notices(self.la.run_dir.path) if n.attempt == self.la.attempt]

    def copy(self) -> list[Notice]:
        with self._lock:
            return list(self.notices)

    def note(self, rank: int) -> str | None:
        """One line a face shows beside node `rank`: unreachable, the hang it holds, or its compute and wait per
        step."""
        return self.health.note(rank) or self.hang_note(rank) or self.stragglers.note(rank)

    @property
    def hung_node(self) -> int | None:
        """The node a hang called now is blamed on (None: no hang now, or one not traced to a node)."""
        v = self.verdict
        return v.node if v is not None and self.hang.fired else None

    def hang_note(self, rank: int) -> str | None:
        v = self.verdict
        if v is None or not self.hang.fired or v.node != rank:
            return None
        held = self.hang.clock() - self.hang.progress_at
        ranks = ", ".join(str(r) for r in v.culprits)
        return f"HUNG: rank {ranks} holds the run, no step for {held:.0f} s (phase {v.phase}); k shows the stacks"

    # ------------------------------------------------------------ one look
    def _run(self, fn: Callable, *args) -> Future:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=3 * len(self.labels) + 2, thread_name_prefix="monitor")
        return self._pool.submit(fn, *args)

    def _submit(self, key: str, node: int, fn: Callable, *args) -> None:
        if key not in self._inflight:
            self._inflight[key] = (self._run(fn, *args), time.monotonic(), node)

    def look(self, check_node: Callable, wait: float = POLL_WAIT_S) -> None:
        la, now = self.la, time.monotonic()
        running = [c for c in la.plan.nodes if la.nodes[c.rank].status == JobState.RUNNING]
        beats_now = now >= self._beats_due
        for c in running:
            if not self.health.due(c.rank):
                continue
            self._submit(f"node{c.rank}", c.rank, check_node, c)
            if beats_now:
                self._submit(f"beats{c.rank}", c.rank, self._read_beats, c)
        if beats_now:
            self._beats_due = now + BEATS_EVERY_S
        if self.health.due(0) and la.nodes[0].status in (JobState.RUNNING, JobState.OK):
            self._submit("metrics", 0, la.metrics.poll)
        futs = [f for f, _, _ in self._inflight.values()]
        if futs:
            wait_futures(futs, timeout=wait)
        self._harvest()
        for rank in self.health.past_bound():
            if self.health.on_bound == "stop" and la.nodes[rank].status == JobState.RUNNING:
                st = la.nodes[rank]
                end = la.metrics.progress.end
                if end and end.get("status") == RunState.OK:
                    # training finished on the master (its end record comes after every rank's last step): the
                    # node's exit code is only unread, and a relaunch would find nothing left to train
                    st.status, st.rc = JobState.OK, None
                    st.error = (f"exit code not read: unreachable for more than {self.health.bound:g} s after "
                                "training finished")
                    continue
                st.status = JobState.LOST
                st.error = (f"unreachable for more than {self.health.bound:g} s (monitor.unreachable_timeout): "
                            f"{self.health.nodes[rank].last_error}")
                st.cause = "UNREACHABLE"
        self._watch_hang()
        self._watch_lost()
        self._watch_stragglers()

    def _harvest(self) -> None:
        now = time.monotonic()
        for key, (fut, started, node) in list(self._inflight.items()):
            if not fut.done():
                if now - started > SILENT_S and key not in self._silent:
                    self._silent.add(key)
                    self.health.failed(node, f"no answer for {now - started:.0f} s", started=started)
                continue
            del self._inflight[key]
            self._silent.discard(key)
            e = fut.exception()
            if isinstance(e, SessionEnded):  # the scheduler's job is over: its word ends the run, not this read
                self.la.transports[node].reset()
                continue
            if e is not None:
                self.health.failed(node, f"{type(e).__name__}: {e}", started=started)
                self.la.transports[node].reset()
                continue
            if key.startswith("beats"):
                self.beats[node] = fut.result()
            self.health.ok(node)

    def _read_beats(self, c) -> dict[int, dict]:
        res = self.la.transports[c.rank].run(["sh", "-c", READ_BEATS, "sh", c.heartbeat_dir], timeout=15)
        if res.rc == 124:
            raise TimeoutError(res.stderr.strip() or "reading the heartbeats timed out")
        return own_beats(parse_beats(res.stdout), c.rank)

    def wait_metrics(self, bound: float = 20.0) -> None:
        """Let a metrics read under way finish (the run's end reads the rest itself)."""
        got = self._inflight.get("metrics")
        if got is not None:
            wait_futures([got[0]], timeout=bound)
            self._harvest()

    # ------------------------------------------------------------ hang
    def _watch_hang(self) -> None:
        end = self.la.metrics.progress.end
        if end and end.get("status") == RunState.OK:
            return  # training finished: ranks on their way out are no hang
        # An unreachable node's last heartbeats are old news, not a stopped rank: only the nodes read now count,
        # and a stall while a node cannot be read is blamed on that node.
        away = sorted(n for n in self.beats if self.health.unreachable(n) and self.beats[n])
        beats = {r: b for n, node in self.beats.items() if n not in away for r, b in node.items()}
        was = self.hang.fired
        v = self.hang.observe(beats, [s.get("step_time") for s in self.la.metrics.progress.steps])
        if was and not self.hang.fired:
            self.verdict = None
            self.say(Notice(HANG_OVER, f"steps finish again (step {self.hang.best_step}): the run is no longer "
                            "hung", attempt=self.la.attempt))
        if v is None:
            return
        if away:
            node = away[0]
            v = replace(v, culprits=sorted(self.beats[node]), node=node, phase="unknown",
                        reason=f"its ranks cannot be read: the node has been unreachable for "
                               f"{self.health.seconds_unreachable(node):.0f} s")
        self.verdict = v
        dest, said = self._collect(v)
        act = {"alert": "the run goes on (monitor.on_hang: alert)",
               "stop": "every node is stopped (monitor.on_hang: stop)",
               "restart": "every node is stopped and the run relaunched from its last checkpoint "
                          "(monitor.on_hang: restart)"}[self.on_hang]
        self.say(Notice(HANG, f"{v.text(self.labels)}; stacks in {dest} ({said}); {act}", v.node,
                        attempt=self.la.attempt,
                        details={"stacks": str(dest), "culprits": v.culprits, "phase": v.phase,
                                 "stalled_s": round(v.stalled_for, 1), "bound_s": v.bound}))
        if self.on_hang in ("stop", "restart"):
            self.hang_action = self.on_hang

    # ------------------------------------------------------------ a machine lost
    def _watch_lost(self) -> None:
        """A node unreachable over SSH whose training peers lost it too (run/watch/blame.py): LOST now, not after
        monitor.unreachable_timeout; the launcher then ends the attempt blaming it."""
        la = self.la
        end = la.metrics.progress.end
        if end:
            return  # training ended: ranks on their way out stall for good reason
        running = [c.rank for c in la.plan.nodes if la.nodes[c.rank].status == JobState.RUNNING]
        since = {r: self.health.nodes[r].since for r in running if self.health.unreachable(r)}
        if not since:
            return
        now = self.hang.clock()
        alive: dict[int, tuple[str, float]] = {}
        for n, node in self.beats.items():
            if n in since or n not in running:
                continue
            stale = set(self.hang._stale(node, now)) if node and all(r in self.hang._seen for r in node) else set(node)
            for r, b in node.items():
                t, t0 = b.get("time"), b.get("phase_since")
                if r not in stale and isinstance(t, (int, float)) and isinstance(t0, (int, float)):
                    alive[r] = (str(b.get("phase", "?")), max(0.0, t - t0))
        got = peer_stall(now=now, unreachable_since=since, alive=alive,
                         step_times=[s.get("step_time") for s in la.metrics.progress.steps],
                         nodes=len(la.plan.nodes),
                         saves=[e.get("seconds") for e in la.metrics.progress.events if e.get("event") == "checkpoint"])
        if got is None:
            return
        st = la.nodes[got.node]
        text = got.text(self.labels.get(got.node, "?"), self.health.nodes[got.node].last_error)
        st.status, st.cause = JobState.LOST, MACHINE_LOST
        st.error = "stopped answering over SSH while its training peers, alive, finished no step"
        self.lost_evidence[got.node] = text
        self.say(Notice(LOST, text, got.node, attempt=la.attempt,
                        details={"unreachable_s": round(got.unreachable_s, 1), "stalled_s": round(got.stalled_s, 1),
                                 "bound_s": round(got.bound_s, 1), "evidence": "peers stalled"}))

    def _collect(self, v: HangVerdict) -> tuple[Path, str]:
        """Every rank's stack into the run directory; (where, what came of it in a few words)."""
        la = self.la
        dest = la.run_dir.path / "stacks" / f"attempt-{la.attempt}-step-{v.step}"
        try:
            dest.mkdir(parents=True, exist_ok=False, mode=0o700)
        except FileExistsError:
            return dest, "collected by another view of this run"
        futs = {}
        for c in la.plan.nodes:
            beats = self.beats.get(c.rank) or {}
            if not beats or self.health.unreachable(c.rank):
                continue
            futs[c.rank] = self._run(collect_node, la.transports[c.rank], c, la._ref(c.rank), beats, dest)
        wait_futures(list(futs.values()), timeout=STACKS_BOUND_S)
        results: dict[int, str] = {}
        for node, f in futs.items():
            if not f.done():
                results.update({r: "no answer in time" for r in self.beats.get(node, {})})
            elif f.exception() is not None:
                results.update({r: f"{type(f.exception()).__name__}: {f.exception()}" for r in self.beats.get(node, {})})
            else:
                results.update(f.result())
        for c in la.plan.nodes:
            if c.rank not in futs:
                results.update({r: "node unreachable" for r in self.beats.get(c.rank, {})})
        if any("--use_cpu" not in c.argv for c in la.plan.nodes):  # CUDA ranks: NCCL's flight recorder too
            fr = {c.rank: self._run(flight_recorder, la.transports[c.rank], c, sorted(self.beats.get(c.rank, {})),
                                    dest) for c in la.plan.nodes if c.rank in futs}
            wait_futures(list(fr.values()), timeout=STACKS_BOUND_S)
            for f in fr.values():
                if f.done() and f.exception() is None:
                    for r, said in f.result().items():
                        results[r] = f"{results.get(r, '?')}; {said}"
        (dest / "summary.json").write_text(json.dumps({str(r): s for r, s in sorted(results.items())}, indent=1))
        ok = sum(1 for s in results.values() if s.startswith("ok"))
        missing = "; ".join(f"rank {r} {s}" for r, s in sorted(results.items()) if not s.startswith("ok"))
        return dest, f"{ok} of {len(results)} ranks answered" + (f"; {missing}" if missing else "")

    # ------------------------------------------------------------ stragglers
    def _watch_stragglers(self) -> None:
        la = self.la
        prog = la.metrics.progress
        # this attempt's records only: a relaunch's follower reads the run's metrics from the start
        began = prog.start.get("time") if prog.start else None
        steps = prog.steps if not isinstance(began, (int, float)) else \
            [r for r in prog.steps if not isinstance(r.get("time"), (int, float)) or r["time"] >= began]
        new, over = self.stragglers.feed(steps)
        for s in new:
            if s.node in la.transports and not self.health.unreachable(s.node):
                self._evidence[s.node] = self._run(node_evidence, la.transports[s.node], self._link(s.node))
                self._pending_stragglers[s.node] = s
            else:
                self._say_straggler(s, "the node cannot be read now")
        for node, fut in list(self._evidence.items()):
            if fut.done():
                del self._evidence[node]
                s = self._pending_stragglers.pop(node)
                self._say_straggler(s, fut.result() if fut.exception() is None else f"no evidence ({fut.exception()})")
        for node in over:
            self.say(Notice(STRAGGLER_OVER, f"node {node} ({self.labels.get(node, '?')}) keeps pace again",
                            node, attempt=la.attempt))

    def _say_straggler(self, s, evidence: str) -> None:
        self.say(Notice(STRAGGLER, f"STRAGGLER: node {s.node} ({self.labels.get(s.node, '?')}) is "
                        f"{s.slower * 100:.0f}% slower than the other nodes: compute {s.compute:.2f} s/step "
                        f"against {s.others:.2f} s (their median) for {s.records} logged steps in a row, and every "
                        f"step waits for it. Evidence: {evidence}", s.node, attempt=self.la.attempt,
                        details={"compute_s": s.compute, "others_s": s.others, "evidence": evidence}))

    def _link(self, node: int) -> float | None:
        try:
            facts = ClusterFacts.from_dict(json.loads((self.la.run_dir.path / "facts.json").read_text()))
        except (OSError, ValueError, TypeError, AttributeError):
            return None
        lk = facts.links.get(node)
        return lk.bandwidth_gbps if lk is not None else None

    def close(self) -> None:
        """The attempt ended: its reader threads go (a later look, by a stop or attach, makes new ones)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._inflight.clear()
        self._silent.clear()
