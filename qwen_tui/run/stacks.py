"""Every rank's Python stack, collected into the run directory when the watchdog calls a hang.

Per node, for the ranks its heartbeats name: `py-spy dump --nonblocking` where py-spy is installed (it
reads a stopped process too), else SIGUSR1, on which the worker's faulthandler appends all its threads'
stacks to heartbeat/stack-rank-<R>.txt on the node; that file's last dump is copied here. A rank that
is stopped cannot answer a signal: it is named as such. Only processes that prove they are the run's
job are signalled (nodes/jobs.py)."""

from __future__ import annotations

import posixpath
import signal
import time
from pathlib import Path

from ..nodes.jobs import JobRef, members
from ..nodes.transport import Transport
from ..plan.launch import NodeCommand

STACK_WAIT_S = 6.0  # how long ranks get to write their dump after SIGUSR1 (the end line follows within a heartbeat)
# the worker closes each dump with this line (training/runtime/stacks.py); what came before it since our last
# look is the dump
END = b"=== end of stacks"


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label) or "node"


def collect_node(t: Transport, cmd: NodeCommand, ref: JobRef | None, beats: dict[int, dict], dest: Path,
                 *, wait_s: float = STACK_WAIT_S) -> dict[int, str]:
    """Stacks of node `cmd`'s ranks into dest/<label>-rank<R>.txt: global rank -> "ok (py-spy)", "ok (SIGUSR1)"
    or why there is none."""
    out: dict[int, str] = {}
    pids = {int(b["pid"]): r for r, b in beats.items() if type(b.get("pid")) is int}
    if ref is None or not pids:
        return {r: "no process recorded" for r in beats}
    procs = [p for p in members(ref, t.job_procs(ref.pid, ref.run_id)) if p.pid in pids]
    found = {pids[p.pid] for p in procs}
    for r in beats:
        if r not in found:
            out[r] = "its process is gone"
    spy = t.run(["sh", "-c", "command -v py-spy"], timeout=10)
    asked = []
    for p in procs:
        r = pids[p.pid]
        if spy.ok and spy.stdout.strip():
            res = t.run([spy.stdout.strip(), "dump", "--nonblocking", "--pid", str(p.pid)], timeout=30)
            if res.ok and res.stdout.strip():
                (dest / f"{_safe(cmd.label)}-rank{r}.txt").write_text(
                    f"=== stacks of rank {r} (pid {p.pid}) by py-spy at {time.ctime()}\n{res.stdout}")
                out[r] = "ok (py-spy)"
                continue
        asked.append(p)
    if not asked:
        return out
    before = {p.pid: len(t.read_file(posixpath.join(cmd.heartbeat_dir, f"stack-rank-{pids[p.pid]}.txt")))
              for p in asked}
    t.kill_procs(asked, signal.SIGUSR1)
    deadline = time.monotonic() + wait_s
    waiting = list(asked)
    while waiting:
        last = time.monotonic() > deadline  # the last look takes a dump without its end line too
        still = []
        for p in waiting:
            r = pids[p.pid]
            data = t.read_file(posixpath.join(cmd.heartbeat_dir, f"stack-rank-{r}.txt"), offset=before[p.pid])
            if END in data or (last and data.strip()):
                (dest / f"{_safe(cmd.label)}-rank{r}.txt").write_text(data.decode(errors="replace"))
                out[r] = "ok (SIGUSR1)"
            else:
                still.append(p)
        waiting = still
        if last:
            break
        time.sleep(0.25)
    for p in waiting:
        out[pids[p.pid]] = ("did not answer SIGUSR1 (process stopped: state T)" if p.state in ("T", "t")
                            else "did not answer SIGUSR1 within {:g} s".format(wait_s))
    return out
