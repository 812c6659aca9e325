"""Following a running job and stopping it, the launch API's last steps (run/api.py is where the faces call them):
`follow()` yields a Snapshot per look at the run, Stopping while a requested stop runs, and ends with Ended;
`stop()` and `stopping()` stop every node now, the second saying how far each is while it runs."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from .events import Ended, Snapshot, Stopping
from .launcher import Launcher, RunOutcome
from .states import JobState
from .watch.metrics import TrainingProgress


def _copy_progress(p: TrainingProgress) -> TrainingProgress:
    return TrainingProgress(start=p.start, end=p.end, steps=list(p.steps), events=list(p.events))


def snapshot(la: Launcher, log_rank: int | None = None, log_lines: int = 60) -> Snapshot:
    mon = la.monitor
    log: list[str] = []
    if log_rank is not None and mon.health.unreachable(log_rank):
        # a read would wait out its bound: the pane says why it is quiet, and reads on once the node answers
        log = [f"(node {log_rank} is unreachable: its log is read on when it answers again)"]
    elif log_rank is not None:
        try:
            log = la.log_tail(log_rank, lines=log_lines)
        except Exception as e:
            log = [f"(cannot read node {log_rank}'s log: {type(e).__name__}: {e})"]
    nodes = {r: (JobState.UNREACHABLE if s.status == JobState.RUNNING and mon.health.unreachable(r) else s.status,
                 s.error)
             for r, s in la.nodes.items()}
    notes = {r: n for r in la.nodes if (n := mon.note(r))}
    return Snapshot(nodes=nodes, progress=_copy_progress(la.metrics.progress), log=log, log_rank=log_rank,
                    notices=tuple(mon.copy()), notes=notes, hung=mon.hung_node)


def follow(la: Launcher, *, interval: float = 0.5, max_seconds: float | None = None,
           log_rank: Callable[[], int] | None = None, log_lines: int = 60,
           cancelled: Callable[[], bool] = lambda: False) -> Iterator[Snapshot | Stopping | Ended]:
    """Watch a running job: a Snapshot per look (every `interval` s), then Ended with the outcome.
    `la.request_stop()` (from any thread) stops every node, with a Stopping event every quarter
    second while it runs, and ends it as stopped; `max_seconds` stops it as failed. When
    `cancelled()` turns true (the face is closing) it returns without Ended: the job runs on, to be
    found again by attach. `log_rank()`: whose log tail to copy."""
    import time

    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    while True:
        if cancelled():
            return
        if la.stop_requested and not la.failing:  # a failure already named ends as one at the next step
            stopped, _ = yield from _stopping(la)
            yield snapshot(la, log_rank() if log_rank else None, log_lines)
            yield Ended(stopped)
            return
        out = la.step(deadline=deadline, max_seconds=max_seconds)
        yield snapshot(la, log_rank() if log_rank else None, log_lines)
        if out is not None:
            yield Ended(out)
            return
        la.pause(interval)


def _stopping(la: Launcher, every: float = 0.25) -> Generator[Stopping, None, tuple[RunOutcome, list[int]]]:
    """Stop every node on a thread of its own and say how far each is while it runs; returns the
    outcome and the ranks where something survived (the generator's value)."""
    import time
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    labels = {c.rank: c.label for c in la.plan.nodes}
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stop") as ex:
        fut = ex.submit(la.stop_and_record)
        while True:
            yield Stopping(la.stop_progress(), labels, time.monotonic() - t0)
            try:
                res = fut.result(timeout=every)  # a bug in the stop raises here, on the follower's thread
            except FutureTimeout:
                continue
            yield Stopping(la.stop_progress(), labels, time.monotonic() - t0)  # each node's last word
            return res


@dataclass(frozen=True)
class Stopped:
    """stop()'s result: the outcome recorded, and the ranks where processes survived."""

    outcome: RunOutcome
    left: list[int]
    already_ended: bool = False


def _ended(la: Launcher) -> RunOutcome | None:
    """The outcome if the job ended meanwhile (every node may have written its exit code since the last look); a
    failure this look names is recorded as the failure it is, not as a stop."""
    ended = la.poll()
    return la.poll() if ended is None and la.failing else ended


def stop(la: Launcher) -> Stopped:
    """Stop every node of a running job now and record it (a job that ended meanwhile is left alone)."""
    ended = _ended(la)
    if ended is not None:
        return Stopped(ended, [], already_ended=True)
    out, left = la.stop_and_record()
    return Stopped(out, left)


def stopping(la: Launcher, every: float = 0.25) -> Generator[Stopping, None, Stopped]:
    """stop(), saying how far each node is while it runs (`res = yield from stopping(la)`)."""
    ended = _ended(la)
    if ended is not None:
        return Stopped(ended, [], already_ended=True)
    out, left = yield from _stopping(la, every)
    return Stopped(out, left)
