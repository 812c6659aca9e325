"""Processes of a run, found the way a user would: by what their command line names (or, for a node's ranks,
the job mark in their environment). Shared by the launch and wizard tests."""

import os
from pathlib import Path


def run_processes(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line mentions `marker` (a run id: the
    worker's metrics path holds it). No "pytest" filter: tmp_path itself is under
    /tmp/pytest-of-*, so such a filter would hide every process of the run."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # exited while we looked
        if marker in cmd and state != "Z":
            out.append(int(d))
    return out


def assert_quiet_stop_logs(plan, when: str = "at step") -> None:
    """Each node's log ends with the stop line ("stopped by request at step N", or `when` instead of "at step"),
    and no traceback of any process comes before it."""
    for c in plan.nodes:
        text = open(c.log_path, encoding="utf-8", errors="replace").read()
        tail = text.splitlines()[-15:]
        assert "Traceback" not in text, f"node {c.rank}'s log holds a traceback:\n" + "\n".join(tail)
        assert "ChildFailedError" not in text and "SignalException" not in text, "\n".join(tail)
        assert any(f"stopped by request {when}" in ln for ln in tail), (
            f"node {c.rank}'s log does not end with the stop line:\n" + "\n".join(tail))


def ranks_of_job(pgid: int) -> list[int]:
    """The worker processes of one node's job: they carry its job mark (they run in sessions of their own)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            environ = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        if f"QWEN_TUI_JOB_PGID={pgid}".encode() in environ and b"training.finetune" in cmd \
                and b"torch.distributed.run" not in cmd and not cmd.startswith(b"sh\0"):
            out.append(int(d))
    return out


def importing_torch(pgid: int) -> bool:
    """Whether node `pgid`'s ranks all exist and have begun loading torch's libraries (the seconds of start-up
    a user can stop in; the first few tens of ms of a new interpreter, before the worker runs, are not)."""
    ranks = ranks_of_job(pgid)
    try:
        return bool(ranks) and all("libtorch" in Path(f"/proc/{r}/maps").read_text() for r in ranks)
    except OSError:
        return False


def environ_of(pid: int) -> dict[str, str]:
    """A process's environment as it started ({} once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(x.decode(errors="replace").partition("=")[::2] for x in raw.split(b"\0") if b"=" in x)
