"""Every rank's Python stack, collected into the run directory when the watchdog calls a hang.

Per node, for the ranks its heartbeats name: `py-spy dump --nonblocking` where py-spy is installed beside the
node's Python (the `debug` extra) or on its PATH (it reads a stopped process too), else SIGUSR1, on which the
worker's faulthandler appends all its threads' stacks to heartbeat/stack-rank-<R>.txt on the node; that file's
last dump is copied here. A rank that is stopped cannot answer a signal: without py-spy it is named as such, with
how to get its stack, and not signalled. Only processes that prove they are the run's job are signalled
(nodes/jobs.py)."""

from __future__ import annotations

import posixpath
import signal
import time
from pathlib import Path

from ...nodes.jobs import JobRef, members
from ...nodes.transport.protocol import Transport
from ...plan.launch import NodeCommand

# Where py-spy is looked for on a node: beside the node's Python (the `debug` extra installs it into that
# environment), else on the login shell's PATH. It prints the first it finds.
_FIND_PY_SPY = 'for p in "$1" "$(command -v py-spy)"; do if [ -x "$p" ]; then echo "$p"; exit 0; fi; done; exit 1'
PY_SPY_HOW = ("install py-spy into the node's Python to read a stopped process's stack: "
              "pip install 'qwen-tui[debug]' (or pip install py-spy)")
STACK_WAIT_S = 6.0  # how long ranks get to write their dump after SIGUSR1 (the end line follows within a heartbeat)
# the worker closes each dump with this line (training/runtime/stacks.py); what came before it since our last
# look is the dump
END = b"=== end of stacks"


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label) or "node"


# PyTorch's NCCL flight recorder, on CUDA runs (training/runtime/dist.py sets it up under --heartbeat_dir): a write
# to a rank's pipe makes NCCL's monitor thread dump the rank's last collectives to nccl_trace_rank_<R>. The write is
# bounded: a pipe nobody reads (a rank gone, a torch without the pipe) never holds the collection up.
FR_PIPE = "nccl_trace_pipe_rank_{}.pipe"
FR_DUMP = "nccl_trace_rank_{}"
_ASK_DUMP = 'if [ -p "$1" ]; then timeout 2 sh -c \'printf 1 > "$1"\' sh "$1" && echo asked; fi; exit 0'


def flight_recorder(t: Transport, cmd: NodeCommand, ranks, dest: Path, *, wait_s: float = STACK_WAIT_S) -> dict[int, str]:
    """Ask each rank's NCCL flight recorder for a dump and copy it to dest/<label>-rank<R>.nccl_trace: rank -> what
    came of it (a few words)."""
    out: dict[int, str] = {}
    asked = []
    before: dict[int, bytes] = {}
    for r in ranks:
        dump = posixpath.join(cmd.heartbeat_dir, FR_DUMP.format(r))
        before[r] = t.read_file(dump, limit=1 << 30)
        res = t.run(["sh", "-c", _ASK_DUMP, "sh", posixpath.join(cmd.heartbeat_dir, FR_PIPE.format(r))], timeout=15)
        if res.ok and "asked" in res.stdout:
            asked.append(r)
        else:
            out[r] = "no flight recorder pipe (not a CUDA rank, or a torch without it)"
    deadline = time.monotonic() + wait_s
    while asked:
        for r in list(asked):
            data = t.read_file(posixpath.join(cmd.heartbeat_dir, FR_DUMP.format(r)), limit=1 << 30)
            if data and data != before[r]:
                (dest / f"{_safe(cmd.label)}-rank{r}.nccl_trace").write_bytes(data)
                out[r] = "flight recorder dumped"
                asked.remove(r)
        if not asked or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    for r in asked:
        out[r] = f"the flight recorder wrote no dump within {wait_s:g} s"
    return out


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
    beside = posixpath.join(posixpath.dirname(cmd.argv[0]), "py-spy") if "/" in cmd.argv[0] else "py-spy"
    spy = t.run(["sh", "-c", _FIND_PY_SPY, "sh", beside], timeout=10)
    spy_path = spy.stdout.strip() if spy.ok else ""
    asked = []
    for p in procs:
        r = pids[p.pid]
        why = ""
        if spy_path:
            res = t.run([spy_path, "dump", "--nonblocking", "--pid", str(p.pid)], timeout=30)
            if res.ok and res.stdout.strip():
                (dest / f"{_safe(cmd.label)}-rank{r}.txt").write_text(
                    f"=== stacks of rank {r} (pid {p.pid}) by py-spy at {time.ctime()}\n{res.stdout}")
                out[r] = "ok (py-spy)"
                continue
            why = f"py-spy failed: {(res.stderr or res.stdout).strip().splitlines()[:1] or ['no output']}"[:200]
        if p.state in ("T", "t"):
            # a stopped process cannot answer a signal; one sent now would dump its stack into the node's log
            # whenever it runs again, long after anyone looks here
            out[r] = (f"process stopped (state T): its stack needs py-spy; {why}" if why else
                      f"process stopped (state T), and py-spy is not on the node: {PY_SPY_HOW}")
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
        out[pids[p.pid]] = "did not answer SIGUSR1 within {:g} s".format(wait_s)
    return out


def read_collected(hang, limit: int = 200_000) -> str:
    """What a hang's notice (run/watch/notices.py, kind HANG) collected, as text for a person: the directory, each
    rank's summary line, then the blamed ranks' stacks and the others'."""
    import json

    where = Path(str(hang.details.get("stacks") or ""))
    culprits = [int(r) for r in hang.details.get("culprits") or [] if str(r).isdigit()]
    out = [hang.text, "", f"stacks in {where}"]
    try:
        summary = json.loads((where / "summary.json").read_text())
    except (OSError, ValueError) as e:
        return "\n".join(out + [f"(cannot read its summary: {e})"])
    out += [f"  rank {r}: {said}" for r, said in sorted(summary.items(), key=lambda kv: int(kv[0]))]
    files = sorted(where.glob("*-rank*.txt"), key=lambda p: (int(p.stem.rsplit("rank", 1)[1]) not in culprits, p.name))
    for f in files:
        out += ["", f"=== {f.name}", f.read_text(errors="replace")]
    text = "\n".join(out)
    return text if len(text) <= limit else text[:limit] + "\n… (cut: the files are in the directory above)"
