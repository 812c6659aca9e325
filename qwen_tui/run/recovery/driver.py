"""Who relaunches a run after a failure: its driver.

The face that launched a run with `training.restarts` (replay, or the wizard's Run screen)
drives its relaunches and records itself in state.json as `driver: {pid, start, host}`, the
start time being /proc/<pid>/stat field 22 as for a job's leader (nodes/jobs.py), so a reused pid
never passes for it. It ends the record when it returns. A face that is killed leaves the record
behind; `attach` then finds no live driver after a failed attempt and claims the role itself.

Claims are compare-and-set on state.json under an exclusive flock on `.driver.lock` in the run
directory: two attachers never both become the driver. The run directory is on the machine
qwen-tui runs on, so the liveness check is a local /proc read. A record made on another host (a
run directory on shared storage) cannot be judged from here and counts as alive.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

from ...nodes.jobs import local_proc
from ..rundir import RunDir, locked_file

log = logging.getLogger(__name__)
CLAIM_BOUND = 10.0  # how long a claim waits for another claim in progress (each holds the lock for one small write)


class DriverBusy(RuntimeError):
    """The claim lock stayed held past its bound: no claim was made."""


def me() -> dict[str, Any]:
    """This process as a driver record."""
    p = local_proc(os.getpid())
    return {"pid": os.getpid(), "start": p.start if p else None, "host": socket.gethostname()}


def alive(rec: Any) -> bool:
    """Whether a driver record names a process that still runs: same pid, same start time, not a zombie.
    A record of another host counts as alive (its /proc is not here); a malformed one as dead."""
    if not isinstance(rec, dict) or type(rec.get("pid")) is not int or rec["pid"] <= 0:
        return False
    if rec.get("host") != socket.gethostname():
        return True
    p = local_proc(rec["pid"])
    # a SIGKILLed face its parent has not reaped yet is a zombie: dead for this purpose
    return p is not None and p.state not in ("Z", "X", "x") and p.start == rec.get("start")


def is_me(rec: Any) -> bool:
    mine = me()
    return isinstance(rec, dict) and all(rec.get(k) == mine[k] for k in ("pid", "start", "host"))


def current(rd: RunDir) -> dict | None:
    rec = rd.read_state().get("driver")
    return rec if isinstance(rec, dict) else None


@contextlib.contextmanager
def _claim_lock(rd: RunDir, bound: float) -> Iterator[None]:
    with locked_file(rd.path / ".driver.lock", bound) as got:
        if not got:  # unlike state.json's lock, never go ahead unlocked
            raise DriverBusy(f"{rd.path / '.driver.lock'} stayed locked for {bound:g}s")
        yield


def record(rd: RunDir, bound: float = CLAIM_BOUND) -> None:
    """The launching face: it is the driver (it started the run), whatever was recorded before."""
    with _claim_lock(rd, bound):
        rd.write_state(driver=me())


def claim(rd: RunDir, bound: float = CLAIM_BOUND) -> bool:
    """Become the driver unless a live one is recorded. True when this process is the driver now
    (it was already, or the recorded one is dead or absent); False when another live face drives."""
    with _claim_lock(rd, bound):
        rec = current(rd)
        if rec is not None and not is_me(rec) and alive(rec):
            return False
        rd.write_state(driver=me())
        return True


def release(rd: RunDir) -> None:
    """End this process's driver record (a record of another face stays)."""
    try:
        with _claim_lock(rd, CLAIM_BOUND):
            if is_me(current(rd)):
                rd.write_state(driver=None)
    except (DriverBusy, OSError, ValueError) as e:
        # the record still names this process: once it has exited, the next claim finds it dead
        log.warning("%s: could not end the driver record: %s", rd.path, e)
