"""What a transport asks of a node through its own `run`: the login directory, paths from it, and a job's processes
(find them, prove them, signal them). SSHTransport and the SLURM transport share these; each brings its own way of
running a command.
"""

from __future__ import annotations

import posixpath
import signal as _signal

from ..jobs import Proc, parse_marks, parse_ppid, parse_stat
from ..programs import program
from .protocol import TransportError

_JOB_PROCS = program("job_procs.sh")  # a job's candidate processes, for qwen_tui.nodes.jobs to judge
_KILL_CHECKED = program("kill_checked.sh")  # signals "pid:start" pairs whose start time is unchanged
_JOB_PIDS = program("job_pids.sh")  # the job's live processes, by group and by mark


class NodeCommands:
    """Mixed into a transport that has `label`, `_home` (None until asked) and `run(argv, timeout=...)`."""

    label: str
    _home: str | None

    # ------------------------------------------------------------ paths
    def home(self, timeout: float = 15.0) -> str:
        """The login directory: relative paths (and ~/) on this node are taken from it,
        the same way for commands, jobs, logs and SFTP."""
        if self._home is None:
            r = self.run(["sh", "-c", 'cd && pwd -P'], timeout=timeout)
            if not r.ok or not r.stdout.strip().startswith("/"):
                raise TransportError(f"{self.label}: cannot find the home directory: {r.stderr.strip()}")
            self._home = r.stdout.strip().splitlines()[-1]
        return self._home

    def abspath(self, path: str) -> str:
        if path == "~":
            return self.home()
        if path.startswith("~/"):
            return posixpath.join(self.home(), path[2:])
        if not path.startswith("/"):
            return posixpath.normpath(posixpath.join(self.home(), path))
        return path

    def proc_start(self, pid, *, timeout=15.0) -> int | None:
        if pid <= 0:
            return None
        r = self.run(["cat", f"/proc/{int(pid)}/stat"], timeout=timeout)
        parsed = parse_stat(r.stdout) if r.ok else None
        return parsed[2] if parsed else None

    def job_procs(self, pgid, run_id, *, timeout=15.0) -> list[Proc]:
        r = self.run(["sh", "-c", _JOB_PROCS, "sh", str(int(pgid)), run_id], timeout=timeout)
        if r.rc != 0:
            raise TransportError(f"{self.label}: listing the job's processes failed (rc {r.rc}): "
                                 f"{r.stderr.strip()[-300:]}")
        out = []
        for line in r.stdout.splitlines():
            pid, _, rest = line.partition("\t")
            stat, _, marks = rest.rpartition("\t")
            parsed = parse_stat(stat)
            if not pid.isdigit() or parsed is None:
                continue
            env = "\0".join(marks.split()).encode()
            out.append(Proc(int(pid), parsed[1], parsed[2], parsed[0], parse_marks(env), parse_ppid(stat)))
        return out

    def kill_procs(self, procs, sig, *, timeout=15.0) -> int:
        if not procs:
            return 0
        name = _signal.Signals(sig).name.removeprefix("SIG")
        r = self.run(["sh", "-c", _KILL_CHECKED, "sh", name, *(f"{p.pid}:{p.start}" for p in procs if p.pid > 1)],
                     timeout=timeout)
        try:
            return int(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise TransportError(f"{self.label}: signalling the job failed: {r.stderr.strip()[-300:]}") from None

    def job_pids(self, pgid: int, *, timeout: float = 15.0) -> list[int]:
        """Live (non-zombie) pids of the job started as `pgid`, on the node."""
        r = self.run(["sh", "-c", _JOB_PIDS, "sh", str(int(pgid))], timeout=timeout)
        if r.rc == 124:
            raise TransportError(f"{self.label}: listing the job's processes timed out")
        return sorted(int(x) for x in r.stdout.split() if x.isdigit())

    def signal_group(self, pgid, sig, *, timeout=15.0) -> bool:
        if pgid <= 1:
            raise ValueError(f"pid {pgid} is never a job's process group")
        name = _signal.Signals(sig).name.removeprefix("SIG")
        pids = self.job_pids(pgid, timeout=timeout)
        if not pids:
            return False
        r = self.run(["kill", "-s", name, "--", *map(str, pids)], timeout=timeout)
        return r.ok or bool(pids)

    def group_alive(self, pgid, *, timeout=15.0) -> bool:
        return bool(self.job_pids(pgid, timeout=timeout))

