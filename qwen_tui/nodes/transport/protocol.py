"""How qwen-tui talks to a node: run a command, copy a file, start a detached job.

`Transport` is the protocol the launcher, probe and checks use; `LocalTransport` (local.py)
runs on this machine with subprocess, `SSHTransport` (ssh.py) over SSH, `SlurmTransport` through srun.
Commands are always argv lists. When a shell is unavoidable (a detached job that
records its exit code), the argv travels as positional parameters of a fixed
script, never pasted into it.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ...base.shell import quote_argv
from ..jobs import Proc


def check_stream_quiet(label: str, argv: Sequence[str], now: float, started: float, last: float, got_line: bool,
                       timeout_first_line: float, idle_timeout: float | None) -> None:
    """The bounds of a silent stream: no first line in time, or silence past idle_timeout."""
    if not got_line and now - started > timeout_first_line:
        raise TransportError(f"{label}: no output within {timeout_first_line:g}s from {quote_argv(argv)[:200]}")
    if got_line and idle_timeout is not None and now - last > idle_timeout:
        raise TransportError(f"{label}: no output for {idle_timeout:g}s from {quote_argv(argv)[:200]}")


@dataclass
class CommandResult:
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


class TransportError(RuntimeError):
    """The node could not be reached or the command could not be run (not a non-zero exit)."""


class SessionEnded(TransportError):
    """The node cannot be reached because what gave it ended: the scheduler's job that held the node (a SLURM
    allocation) is over. Not a node gone silent: the scheduler's own word on the job says how the run ended."""


Progress = Callable[[int, int], None] | None  # (bytes done, bytes in all) while a file is copied


class Transport(Protocol):
    """Everything the launcher, probe, checks, monitor and sync ask of a node; LocalTransport and SSHTransport
    do all of it, so no caller has to ask what a transport can do."""

    label: str

    def run(self, argv: Sequence[str], *, timeout: float, input: bytes | None = None,
            env: Mapping[str, str] | None = None, cwd: str | None = None) -> CommandResult: ...

    def stream_lines(self, argv: Sequence[str], *, stop: threading.Event, timeout_first_line: float = 15.0,
                     idle_timeout: float | None = None, poll: float = 0.2) -> Iterator[str]:
        """One long-lived command's output lines as they arrive, until `stop` is set or it ends."""
        ...

    def abspath(self, path: str) -> str:
        """`path` as the node reads it: ~ and relative paths from the login directory."""
        ...

    def host_key(self) -> str:
        """The host key this connection verified, as `ssh-keygen -l` names it ("ssh-ed25519 SHA256:…");
        "" for this machine."""
        ...

    def start_job(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, log: str,
                  rcfile: str, timeout: float = 30.0, run_id: str = "") -> int:
        """Start a detached job in its own process group; return its pid (= pgid)."""
        ...

    def proc_start(self, pid: int, *, timeout: float = 15.0) -> int | None:
        """The start time (clock ticks after boot) of process `pid`, None if there is none."""
        ...

    def job_procs(self, pgid: int, run_id: str, *, timeout: float = 15.0) -> list[Proc]:
        """Process `pgid`, its group, and every process marked with run `run_id`."""
        ...

    def kill_procs(self, procs: Sequence[Proc], sig: int, *, timeout: float = 15.0) -> int:
        """Signal each of `procs` whose start time is unchanged; how many were signalled."""
        ...

    def signal_group(self, pgid: int, sig: int, *, timeout: float = 15.0) -> bool:
        """Send `sig` to the process group; False if no such group is alive."""
        ...

    def group_alive(self, pgid: int, *, timeout: float = 15.0) -> bool: ...

    def read_file(self, path: str, *, offset: int = 0, limit: int = 1 << 20, timeout: float = 15.0) -> bytes: ...

    def put_file(self, local: str, remote: str, *, timeout: float = 600.0, progress: Progress = None) -> None: ...

    def get_file(self, remote: str, local: str, *, timeout: float = 600.0, progress: Progress = None) -> None:
        """Copy the node's file `remote` to this machine's `local`."""
        ...

    def reset(self) -> None:
        """Drop the connection at once (a read timed out); the next command connects anew."""
        ...

    def close(self) -> None: ...


def stop_group(t: Transport, pgid: int, grace: float = 10.0) -> bool:
    """SIGTERM the group, wait up to `grace` seconds, then SIGKILL. True when it is gone.
    For groups this process started a moment ago (the rehearsal); a pid read back from
    a run directory goes through qwen_tui.nodes.jobs.stop_job, which checks it first."""
    if pgid <= 1:
        raise ValueError(f"pid {pgid} is never a job's process group")
    if not t.group_alive(pgid):
        return True
    t.signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not t.group_alive(pgid):
            return True
        time.sleep(0.2)
    t.signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if not t.group_alive(pgid):
            return True
        time.sleep(0.1)
    return not t.group_alive(pgid)
