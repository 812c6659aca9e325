"""LocalTransport: the Transport protocol on this machine, through subprocess (a `localhost` node, and the master
when it is this machine). A job's processes are found and proven ours from /proc, as a node's are by the
programs the other transports send."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from ...base.shell import quote_argv
from ..jobs import JOB_MARK, RUN_MARK, Proc, job_argv, local_kill, local_proc, local_procs
from .protocol import CommandResult, check_stream_quiet


class LocalTransport:
    """This machine, through subprocess. Used for `localhost` nodes."""

    def __init__(self, label: str = "localhost"):
        self.label = label

    def run(self, argv, *, timeout, input=None, env=None, cwd=None) -> CommandResult:
        full_env = {**os.environ, **(env or {})}
        try:
            p = subprocess.run(list(argv), input=input, capture_output=True, timeout=timeout,
                               env=full_env, cwd=cwd)
        except FileNotFoundError as e:
            return CommandResult(127, "", f"{argv[0]}: command not found ({e.strerror})")
        except subprocess.TimeoutExpired:
            return CommandResult(124, "", f"timed out after {timeout:g}s: {quote_argv(argv)}")
        return CommandResult(p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))

    def stream_lines(self, argv: Sequence[str], *, stop: threading.Event, timeout_first_line: float = 15.0,
                     idle_timeout: float | None = None, poll: float = 0.2) -> Iterator[str]:
        """One long-lived command; its stdout+stderr lines as they arrive, until `stop`
        is set, the command ends or the iterator is closed. The command runs in its own
        process group, which is terminated (then killed) when the stream ends. A
        missing program yields nothing. Bounds as SSHTransport.stream_lines."""
        if not argv:
            raise ValueError("empty argv")
        try:
            p = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        except FileNotFoundError:
            return
        fd = p.stdout.fileno()
        buf = b""
        started = last = time.monotonic()
        got_line = False
        try:
            while not stop.is_set():
                r, _, _ = select.select([fd], [], [], poll)
                now = time.monotonic()
                if not r:
                    check_stream_quiet(self.label, argv, now, started, last, got_line, timeout_first_line,
                                       idle_timeout)
                    continue
                data = os.read(fd, 65536)
                if not data:
                    break
                last = now
                buf += data
                while b"\n" in buf:
                    line, _, buf = buf.partition(b"\n")
                    got_line = True
                    yield line.rstrip(b"\r").decode(errors="replace")
                    if stop.is_set():
                        return
            if buf and not stop.is_set():
                yield buf.decode(errors="replace")
        finally:
            _end_process_group(p)

    def start_job(self, argv, *, env, cwd, log, rcfile, timeout=30.0, run_id="") -> int:
        # The run mark is in the environment the first exec gets: Popen returns after that
        # exec, so from the moment the pid is known /proc/PID/environ proves the job is ours.
        # 0700: the run directory holds logs and exit codes of this user's job only
        Path(log).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        p = subprocess.Popen(job_argv(argv, cwd, log, rcfile, run_id=run_id), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, env={**os.environ, **env, RUN_MARK: run_id})
        # Reap it in the background so it does not linger as a zombie while we watch.
        threading.Thread(target=p.wait, daemon=True).start()
        return p.pid

    def proc_start(self, pid, *, timeout=15.0) -> int | None:
        p = local_proc(pid) if pid > 0 else None
        return p.start if p else None

    def job_procs(self, pgid, run_id, *, timeout=15.0) -> list[Proc]:
        return local_procs(pgid, run_id)

    def kill_procs(self, procs, sig, *, timeout=15.0) -> int:
        return local_kill(procs, sig)

    def signal_group(self, pgid, sig, *, timeout=15.0) -> bool:
        if pgid <= 1:  # killpg(0) is our own group, killpg(1) everything init leads
            raise ValueError(f"pid {pgid} is never a job's process group")
        hit = False
        try:
            os.killpg(pgid, sig)
            hit = True
        except ProcessLookupError:
            pass  # the group leader's group may be gone while marked ranks live on
        for pid in _marked_pids(pgid):
            try:
                os.kill(pid, sig)
                hit = True
            except ProcessLookupError:
                pass  # exited between the scan and the signal
        return hit

    def group_alive(self, pgid, *, timeout=15.0) -> bool:
        if any(not _is_zombie(p) for p in _marked_pids(pgid)):
            return True
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A group whose only members are zombies is dead for our purposes.
        return any(_pgid_of(pid) == pgid and not _is_zombie(pid) for pid in _all_pids())

    def read_file(self, path, *, offset=0, limit=1 << 20, timeout=15.0) -> bytes:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""

    def put_file(self, local, remote, *, timeout=600.0, progress=None) -> None:
        import shutil
        import tempfile

        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        # mkstemp (O_EXCL) in the target's directory: a planted `<name>.part` link is never written through
        fd, tmp = tempfile.mkstemp(prefix=f".{Path(remote).name}.", suffix=".part", dir=Path(remote).parent)
        try:
            with os.fdopen(fd, "wb") as dst, open(local, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.chmod(tmp, 0o644)
            os.replace(tmp, remote)
        except BaseException:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            raise
        if progress:
            size = os.path.getsize(remote)
            progress(size, size)

    def get_file(self, remote, local, *, timeout=600.0, progress=None) -> None:
        self.put_file(remote, local, timeout=timeout, progress=progress)  # both ends are this machine

    def abspath(self, path: str) -> str:
        return os.path.abspath(os.path.expanduser(path))

    def host_key(self) -> str:
        return ""

    def reset(self) -> None:
        """Nothing to drop: this machine is always reachable."""

    def close(self) -> None:
        return None


def _end_process_group(p: subprocess.Popen, grace: float = 3.0) -> None:
    """TERM the group p leads, KILL it after `grace` seconds; reap p."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if p.poll() is not None:
            break
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            break  # already gone
        try:
            p.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue  # next: SIGKILL
    if p.stdout is not None:
        p.stdout.close()


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _marked_pids(pgid: int) -> list[int]:
    """Processes whose environment carries JOB_MARK=pgid (they may have left the group)."""
    mark = f"{JOB_MARK}={int(pgid)}".encode()
    out = []
    for pid in _all_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    out.append(pid)
        except OSError:
            continue  # gone, or not ours to read
    return out


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: split after the last ')'
    return s[s.rfind(")") + 2:].split()


def _pgid_of(pid: int) -> int | None:
    f = _stat_fields(pid)
    return int(f[2]) if f else None


def _is_zombie(pid: int) -> bool:
    f = _stat_fields(pid)
    return bool(f) and f[0] == "Z"
