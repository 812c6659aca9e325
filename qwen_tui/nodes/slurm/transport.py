"""SlurmTransport: the Transport protocol on a node of a SLURM allocation, through `srun`.

Nothing here needs SSH between the nodes. Two kinds of job step:
- one `srun --overlap` step per node runs the node's command server (remote/agent.py) for as long as qwen-tui
  follows the allocation: every check, read and signal is a line on its pipe (one step per node, not one per
  command: SLURM's controller and accounting see a handful of steps per run);
- each node's training job is a job step of its own (`srun --whole` on that node: every CPU and GPU the
  allocation holds there), whose task runs the same job script as over SSH (remote/job.sh: its log, its exit code,
  every process marked with the run), and prints its pid first. The srun that owns the step runs on this machine
  in a session of its own, so it outlives the face that started it, as a detached SSH job does; cancelling the
  allocation (scancel) or a failed node ends the step, and SLURM kills what the step holds.
"""

from __future__ import annotations

import base64
import os
import posixpath
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..jobs import RUN_MARK, job_argv
from ..transport.node_commands import NodeCommands
from ..transport.protocol import CommandResult, TransportError
from .agent_link import AgentLink

SRUN = "srun"
# The task's first line is its pid (the job script's, which is the process group it leads: SLURM starts every task
# in a group of its own); then the job script takes over the same process.
_PID_FIRST = 'echo "$$"; exec "$@"'
_CHUNK = 1 << 20


def srun_base(job_id: str, host: str) -> list[str]:
    """srun's options for one task on one node of job `job_id`."""
    return [SRUN, "--jobid", job_id, "--nodelist", host, "--nodes", "1", "--ntasks", "1", "--quiet"]


class SlurmTransport(NodeCommands):
    def __init__(self, label: str, host: str, job_id: str, *, python: str = "python3", start_bound: float = 60.0):
        self.label = label
        self.host = host
        self.job_id = job_id
        self.python = python
        self._home: str | None = None
        # The agent's step overlaps the training step: it asks for no resources of its own.
        self.link = AgentLink(label, [*srun_base(job_id, host), "--overlap", "--unbuffered",
                                      "--job-name", f"qwen-tui-agent-{host}", python],
                              start_bound=start_bound)

    def __repr__(self) -> str:
        return f"SlurmTransport({self.label!r}, job {self.job_id}, {self.host})"

    # ------------------------------------------------------------ commands
    def run(self, argv, *, timeout, input=None, env=None, cwd=None) -> CommandResult:
        if not argv:
            raise ValueError("empty argv")
        if cwd is not None and cwd.startswith("~"):
            cwd = self.abspath(cwd)
        rc, out, err = self.link.run(argv, timeout=timeout, input=input, env=env, cwd=cwd)
        return CommandResult(rc, out.decode(errors="replace"), err.decode(errors="replace"))

    def stream_lines(self, argv: Sequence[str], *, stop: threading.Event, timeout_first_line: float = 15.0,
                     idle_timeout: float | None = None, poll: float = 0.2) -> Iterator[str]:
        return self.link.stream(argv, stop=stop, timeout_first_line=timeout_first_line, idle_timeout=idle_timeout,
                                poll=poll)

    def home(self, timeout: float = 15.0) -> str:
        if self._home is None:
            self.link.call("hello", timeout)
            self._home = str(self.link.hello.get("home") or "")
            if not self._home.startswith("/"):
                raise TransportError(f"{self.label}: cannot find the home directory")
        return self._home

    def host_key(self) -> str:
        return ""  # SLURM authenticates the steps (munge); there is no host key to show

    # ------------------------------------------------------------ files
    def read_file(self, path, *, offset=0, limit=1 << 20, timeout=15.0) -> bytes:
        ans = self.link.call("read", timeout, path=self.abspath(path), offset=offset, limit=limit)
        return b"" if ans.get("missing") else base64.b64decode(ans["data"])

    def put_file(self, local, remote, *, timeout=600.0, progress=None) -> None:
        remote = self.abspath(remote)
        size = os.path.getsize(local)
        deadline = time.monotonic() + timeout
        done = 0
        with open(local, "rb") as f:
            first = True
            while True:
                chunk = f.read(_CHUNK)
                last = done + len(chunk) >= size
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransportError(f"{self.label}: copying to {remote} timed out after {timeout:g}s")
                self.link.call("put", left, path=remote, data=base64.b64encode(chunk).decode(), first=first,
                               last=last, mode=0o644)
                done += len(chunk)
                first = False
                if progress:
                    progress(done, size)
                if last:
                    return

    def get_file(self, remote, local, *, timeout=600.0, progress=None) -> None:
        remote = self.abspath(remote)
        deadline = time.monotonic() + timeout
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{local}.{os.getpid()}.part"
        done = 0
        try:
            with open(tmp, "wb") as f:
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TransportError(f"{self.label}: reading {remote} timed out after {timeout:g}s")
                    ans = self.link.call("read", left, path=remote, offset=done, limit=_CHUNK)
                    if ans.get("missing"):
                        raise TransportError(f"{self.label}: reading {remote} failed: no such file")
                    data = base64.b64decode(ans["data"])
                    f.write(data)
                    done += len(data)
                    if progress:
                        progress(done, done)
                    if len(data) < _CHUNK:
                        break
            os.replace(tmp, local)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    # ------------------------------------------------------------ the training job
    def start_job(self, argv, *, env, cwd, log, rcfile, timeout=60.0, run_id="") -> int:
        """A job step on this node that runs `argv` as remote/job.sh does; its pid on the node. The srun that owns
        the step runs here, detached; what it says goes to `<rcfile>.srun` beside the run's files here when that
        directory is on this machine (shared storage), else to this user's cache."""
        cwd, log, rcfile = self.abspath(cwd), self.abspath(log), self.abspath(rcfile)
        dirs = sorted({posixpath.dirname(log) or "/", posixpath.dirname(rcfile) or "/"})
        made = self.run(["mkdir", "-p", "-m", "700", "--", *dirs], timeout=min(timeout, 30))
        if not made.ok:
            raise TransportError(f"{self.label}: cannot make {' '.join(dirs)}: {made.stderr.strip()[-300:]}")
        out = _srun_output(rcfile)
        step = [*srun_base(self.job_id, self.host), "--whole", "--kill-on-bad-exit=1", "--unbuffered",
                "--job-name", f"qwen-tui-{run_id or 'job'}-{self.host}", "--chdir", "/",
                "sh", "-c", _PID_FIRST, "sh",
                *job_argv(argv, cwd, log, rcfile, run_id=run_id)]
        # The job's environment (secrets too) reaches the task the way srun passes its own environment on, never
        # through argv or a file.
        full_env = {**os.environ, **env, RUN_MARK: run_id}
        with open(out, "wb") as sink:
            try:
                p = subprocess.Popen(step, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, env=full_env,
                                     start_new_session=True)
            except OSError as e:
                raise TransportError(f"{self.label}: cannot start srun: {e}") from None
        threading.Thread(target=p.wait, daemon=True).start()  # reaped here while this process lives
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            first = Path(out).read_bytes().split(b"\n", 1)
            if len(first) == 2 and first[0].strip().isdigit():
                return int(first[0])
            if p.poll() is not None:
                break
            time.sleep(0.05)
        said = Path(out).read_text(errors="replace").strip()
        if p.poll() is None:
            os.killpg(p.pid, 15)
        raise TransportError(f"{self.label}: the job step did not start within {timeout:g}s"
                             if p.returncode is None else
                             f"{self.label}: the job step did not start (srun exited {p.returncode})"
                             + (f": {said[-500:]}" if said else ""))

    # ------------------------------------------------------------ connection
    def reset(self) -> None:
        self.link.close()

    def close(self) -> None:
        self.link.close()


def _srun_output(rcfile: str) -> str:
    """Where the local srun of a job step writes what it says."""
    here = posixpath.dirname(rcfile)
    if os.path.isdir(here) and os.access(here, os.W_OK):
        return rcfile + ".srun"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qwen-tui" / "srun"
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    return str(cache / (posixpath.basename(rcfile) + f".{os.getpid()}.srun"))
