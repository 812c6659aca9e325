"""Which processes on a node belong to a job qwen-tui started, and how to stop them.

`job_argv` starts a job (remote/job.sh), whose processes carry the marks below in their environment (the
leader the run mark, from its exec).

A run directory names each node's job by pid, but a pid read back from a file is
only a number: the process may have ended and the pid gone to something else, or
the file may have been edited. Nothing is signalled unless it proves it is ours:

- the job's leader (`pid`, its own process group) is ours when its start time is
  the one recorded at launch and its environment carries this run's id;
- any other process is ours when its environment carries both this run's id and
  the job mark `QWEN_TUI_JOB_PGID=<pid>` (torchrun's ranks run in sessions of
  their own, so they are found by mark, not by group);
- members of a verified leader's process group are ours (a process can only join
  a group of its own session, and the job is a session of its own).

Pids 0 and 1 are never a job. The rules are pure functions over `Proc` rows, which
each transport reads from /proc on its node.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .programs import program

# The environment marks every process of a job carries (remote/job.sh and detach.sh set them, under these names).
JOB_MARK = "QWEN_TUI_JOB_PGID"
RUN_MARK = "QWEN_TUI_RUN_ID"
MARKS = (JOB_MARK, RUN_MARK)
# A rank that has reached the stop's waiter (training/runtime/stop.py's STOP_MARK, set by its exec): it ends on its
# own. Read from a process's environment with the two above.
STOP_MARK = "QWEN_TUI_STOPPING"
READ_MARKS = (*MARKS, STOP_MARK)
# How much longer than its grace a stop waits for a job that is ending on its own (its ranks have all stopped or
# reached the waiter, which imports torch again: more than the grace on a loaded 2-core machine), before it signals
# torchrun's agents (which then print tracebacks over a stop that was going well).
ENDING_EXTRA_S = 30.0
# A job left with its agent alone (at torchrun's exit barrier, waiting for the other nodes' agents) is ending on its
# own while some node of the run shows a waiter, or did this recently (its agent checks in a moment after it ends).
WAITER_SEEN_S = 3.0
# A detached job: its log, its exit code in a file when it ends, every process marked (remote/job.sh).
JOB_SCRIPT = program("job.sh")


def job_argv(argv: Sequence[str], cwd: str, log: str, rcfile: str, *, envfile: str = "",
             run_id: str = "") -> list[str]:
    """argv that runs `argv` as a job (JOB_SCRIPT); the leader carries RUN_MARK from its exec."""
    return ["env", f"{RUN_MARK}={run_id}", "sh", "-c", JOB_SCRIPT, "sh", cwd, log, rcfile, envfile, *argv]


@dataclass(frozen=True)
class JobRef:
    """A job as recorded at launch: its leader's pid (= pgid), start time, run id."""

    pid: int
    start: int | None  # the leader's start time (clock ticks after boot, /proc/PID/stat field 22)
    run_id: str


@dataclass(frozen=True)
class Proc:
    pid: int
    pgrp: int
    start: int
    state: str
    marks: dict[str, str] = field(default_factory=dict)
    ppid: int | None = None  # the parent's pid, where it was read


def parse_stat(text: str) -> tuple[str, int, int] | None:
    """(state, pgrp, start time) from the text of /proc/PID/stat, or None."""
    # comm may hold spaces and parentheses: the fields start after the last ')'
    rest = text[text.rfind(")") + 1:].split()
    try:
        return rest[0], int(rest[2]), int(rest[19])
    except (IndexError, ValueError):
        return None


def parse_ppid(text: str) -> int | None:
    """The parent's pid from the text of /proc/PID/stat, or None."""
    rest = text[text.rfind(")") + 1:].split()
    try:
        return int(rest[1])
    except (IndexError, ValueError):
        return None


def parse_marks(environ: bytes) -> dict[str, str]:
    out = {}
    for item in environ.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k.decode(errors="replace") in READ_MARKS:
            out[k.decode()] = v.decode(errors="replace")
    return out


def members(ref: JobRef, procs: Iterable[Proc]) -> list[Proc]:
    """The live processes of `ref`'s job among `procs` (see the module docstring)."""
    if ref.pid <= 1 or not ref.run_id:
        return []
    procs = list(procs)
    leader = next((p for p in procs if p.pid == ref.pid), None)
    leader_ok = (leader is not None and ref.start is not None and leader.start == ref.start
                 and leader.pgrp == ref.pid and leader.marks.get(RUN_MARK) == ref.run_id)
    out = []
    for p in procs:
        if p.pid <= 1 or p.state == "Z":
            continue
        marked = p.marks.get(RUN_MARK) == ref.run_id and p.marks.get(JOB_MARK) == str(ref.pid)
        if marked or (leader_ok and p.pgrp == ref.pid):
            out.append(p)
    return out


def leader_alive(ref: JobRef, procs: Iterable[Proc]) -> bool:
    """Is the job's shell (the leader, which writes the exit code when the command ends)
    still there? Without it no exit code can ever come, whatever else of the job lives on:
    torchrun's ranks outlive their agent (sessions of their own) and would keep a killed
    job looking alive."""
    for p in procs:
        if p.pid == ref.pid and p.state != "Z" and p.pgrp == ref.pid:
            if ref.start is None:  # no start time recorded: the run's mark must vouch for it
                return p.marks.get(RUN_MARK) == ref.run_id
            return p.start == ref.start
    return False


def verdict(ref: JobRef, procs: Iterable[Proc]) -> tuple[str, str]:
    """("ours", ...) when the job has live processes, ("gone", why) when nothing of it
    is left, ("refused", why) when the recorded pid is alive but not provably ours."""
    if ref.pid <= 1:
        return "refused", f"pid {ref.pid} is never a job's process group"
    procs = list(procs)
    if members(ref, procs):
        return "ours", ""
    leader = next((p for p in procs if p.pid == ref.pid and p.state != "Z"), None)
    if leader is None:
        return "gone", f"no process {ref.pid} is left"
    if ref.start is None:
        return "refused", f"pid {ref.pid} is alive but no start time was recorded for it at launch"
    if leader.start != ref.start:
        return "refused", (f"pid {ref.pid} is another process (started at tick {leader.start}, "
                           f"the job at tick {ref.start})")
    return "refused", f"pid {ref.pid} does not carry this run's mark ({RUN_MARK}={ref.run_id})"


class JobHost(Protocol):
    """What a transport offers for jobs (LocalTransport and SSHTransport both do)."""

    def job_procs(self, pgid: int, run_id: str, *, timeout: float = 15.0) -> list[Proc]: ...

    def kill_procs(self, procs: Sequence[Proc], sig: int, *, timeout: float = 15.0) -> int: ...


def job_verdict(t: JobHost, ref: JobRef) -> tuple[str, str]:
    if ref.pid <= 1:
        return verdict(ref, [])
    return verdict(ref, t.job_procs(ref.pid, ref.run_id))


def signal_job(t: JobHost, ref: JobRef, sig: int) -> int:
    """Send `sig` to every live process of the job; how many were signalled."""
    if ref.pid <= 1:
        return 0
    found = members(ref, t.job_procs(ref.pid, ref.run_id))
    return t.kill_procs(found, sig) if found else 0


def workers(ref: JobRef, procs: Iterable[Proc]) -> list[Proc]:
    """The job's processes outside its leader's group whose parent is the job's too: the ranks torchrun started
    (each in a session of its own) and whatever they started. A torchrun agent in a container is outside the
    group as well (the runtime starts it in a session of its own) but its parent is the runtime's monitor, not
    the job's: it is no worker, and is left to see its workers end, as an agent on the node itself is."""
    mine = members(ref, procs)
    pids = {p.pid for p in mine}
    return [p for p in mine if p.pgrp != ref.pid and (p.ppid is None or p.ppid in pids)]


class Waiters:
    """What a run's stops (one a node, in threads of their own) saw of the stop's waiter: the waiter on node 0 lets
    the other nodes' agents check out at torchrun's exit barrier, so an agent left alone on another node is ending on
    its own only while a waiter runs somewhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: float | None = None

    def saw(self) -> None:
        with self._lock:
            self._last = time.monotonic()

    def recent(self) -> bool:
        with self._lock:
            return self._last is not None and time.monotonic() - self._last < WAITER_SEEN_S


def stop_job(t: JobHost, ref: JobRef, grace: float = 10.0,
             on_phase: Callable[[str], None] | None = None, waiters: Waiters | None = None) -> bool:
    """Stop the job; True when nothing of it is left. Touches only processes that prove they are
    the job's. `on_phase(text)` hears each phase, for a face that shows the stop's progress.

    The ranks are asked first (SIGTERM to them alone): the worker ends quietly with one line
    (training/runtime/stop.py), its torchrun agent then sees its workers done and exits on its own, and
    the job shell writes the exit code; no agent is interrupted into printing a traceback.
    What is left after `grace` seconds gets SIGTERM, then SIGKILL; but a job ending on its own by then (every rank
    left is the stop's waiter, or no rank is left while `waiters`, shared by the run's stops, saw one recently) gets
    up to ENDING_EXTRA_S more first."""
    say = on_phase or (lambda text: None)
    waiters = waiters or Waiters()
    if ref.pid <= 1:
        return True
    procs = t.job_procs(ref.pid, ref.run_id)
    if not members(ref, procs):
        say("stopped (nothing was running)")
        return True
    deadline = time.monotonic() + grace
    ranks = workers(ref, procs)
    if ranks:
        t.kill_procs(ranks, signal.SIGTERM)
        say(f"waiting for {len(ranks)} worker process(es) to stop (up to {grace:g} s)")
        if _gone_within(t, ref, grace, waiters):
            say("stopped")
            return True
        if _ending(ref, t.job_procs(ref.pid, ref.run_id), waiters):
            say(f"the workers have stopped; waiting up to {ENDING_EXTRA_S:g} s more for torchrun to end")
            if _gone_within(t, ref, ENDING_EXTRA_S, waiters, while_=_ending):
                say("stopped")
                return True
            deadline = time.monotonic()
    say("SIGTERM to the rest of the job")
    signal_job(t, ref, signal.SIGTERM)
    if _gone_within(t, ref, max(1.0, deadline - time.monotonic()), waiters):
        say("stopped")
        return True
    say("SIGKILL")
    signal_job(t, ref, signal.SIGKILL)
    gone = _gone_within(t, ref, 5.0, waiters)
    say("stopped (killed)" if gone else "processes survive")
    return gone


def _waiting(ref: JobRef, procs: list[Proc]) -> tuple[list[Proc], bool]:
    """The job's ranks, and whether every one of them is the stop's waiter (none left: False)."""
    ranks = workers(ref, procs)
    return ranks, bool(ranks) and all(p.marks.get(STOP_MARK) == "1" for p in ranks)


def _ending(ref: JobRef, procs: list[Proc], waiters: Waiters) -> bool:
    """Whether the job is ending on its own: every rank of it still there is the stop's waiter, or none is left (the
    agent and the job's shell, at torchrun's exit barrier) while a waiter ran somewhere a moment ago."""
    ranks, waiting = _waiting(ref, procs)
    return waiting or (not ranks and waiters.recent())


def _gone_within(t: JobHost, ref: JobRef, bound: float, waiters: Waiters,
                 while_: Callable[[JobRef, list[Proc], Waiters], bool] | None = None) -> bool:
    """Whether the job is gone within `bound` seconds (looked at every 0.2 s, each look telling `waiters` whether
    it saw the stop's waiter); False as soon as `while_(ref, procs, waiters)` says the wait is no longer worth it."""
    deadline = time.monotonic() + bound
    while True:
        procs = t.job_procs(ref.pid, ref.run_id)
        if not members(ref, procs):
            return True
        if _waiting(ref, procs)[1]:
            waiters.saw()
        if time.monotonic() >= deadline or (while_ is not None and not while_(ref, procs, waiters)):
            return False
        time.sleep(0.2)


# ---------------------------------------------------------------- this machine's /proc

def _read(path: str, mode: str = "r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None  # gone, or not ours to read


def local_proc(pid: int) -> Proc | None:
    stat = _read(f"/proc/{pid}/stat")
    parsed = parse_stat(stat) if stat else None
    if parsed is None:
        return None
    env = _read(f"/proc/{pid}/environ", "rb") or b""
    return Proc(pid, parsed[1], parsed[2], parsed[0], parse_marks(env), parse_ppid(stat))


def local_procs(pgid: int, run_id: str) -> list[Proc]:
    """The leader `pgid` and every process here whose environment carries run `run_id`."""
    mark = f"{RUN_MARK}={run_id}".encode()
    out = []
    for d in _all_pids():
        env = _read(f"/proc/{d}/environ", "rb")
        if d == pgid or (env and mark in env.split(b"\0")):
            p = local_proc(d)
        else:  # a member of the group that changed its environment
            stat = _read(f"/proc/{d}/stat")
            parsed = parse_stat(stat) if stat else None
            p = Proc(d, parsed[1], parsed[2], parsed[0], ppid=parse_ppid(stat)) if parsed and parsed[1] == pgid \
                else None
        if p is not None:
            out.append(p)
    return out


def local_kill(procs: Sequence[Proc], sig: int) -> int:
    """Signal each process whose start time is still the one just read (no reused pid)."""
    n = 0
    for p in procs:
        now = local_proc(p.pid)
        if p.pid <= 1 or now is None or now.start != p.start:
            continue
        try:
            os.kill(p.pid, sig)
            n += 1
        except ProcessLookupError:
            continue  # ended between the check and the signal
    return n


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_script(env: dict[str, str]) -> bytes:
    """`export K='v'` lines a POSIX shell sources: a job's environment travels through a
    0600 file instead of its argv (which `ps` shows to every user of the node)."""
    lines = []
    for k, v in env.items():
        if not _ENV_NAME.fullmatch(k):
            raise ValueError(f"{k!r} is not a valid environment variable name")
        if "\0" in v:
            raise ValueError(f"the value of {k} holds a NUL byte")
        lines.append(f"export {k}={shlex.quote(v)}\n")
    return "".join(lines).encode()
