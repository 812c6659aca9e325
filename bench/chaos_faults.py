"""The faults bench/chaos_soak.py injects into a running job on the namespace cluster, each one waited out
to its end (bounded) so that what the run did about it can be read afterwards from the run directory.

- ssh: every packet to the node's sshd dropped for a while (iptables on port 22 only: gloo's ports stay
  open, so training goes on and only qwen-tui's view of the node is cut);
- hang: one rank stopped with SIGSTOP until the watchdog names it (or a bound passes), then let go;
- kill: the node's torchrun agent and its ranks SIGKILLed at once, as when a node dies;
- throttle: the node's ranks put in a cgroup capped at a few percent of one CPU for a while;
- lost-reset: the machine goes as a crashed or rebooted one does (its processes gone, every TCP segment answered with
  a reset, SSH too); lost-silent: it goes silent (every packet dropped, its processes frozen). Either lasts until
  the run has relaunched without it (or a bound), then the node comes back for the next run.

Each returns a Fault with its wall-clock window: what happened inside it (notices, attempts ended) is
the fault's outcome (chaos_report.py decides it).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from support.field_run import CpuThrottle, records

KINDS = ("ssh", "hang", "kill", "throttle", "lost-reset", "lost-silent")


@dataclass
class Fault:
    kind: str
    node: int
    run: str  # the run's id (its run directory's name)
    at: float  # wall clock when it was injected (notices and attempts carry the same clock)
    duration: float = 0.0  # how long the fault itself lasted (the cut, the stop, the throttle)
    until: float = 0.0  # wall clock when the soak stopped watching its effects
    detail: dict = field(default_factory=dict)  # the rank stopped, pids killed, the CPU cap, ...

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Live:
    """What a fault needs to know of the run it hits."""

    field: object  # field_run.FieldCluster
    replay: object  # field_run.Replay
    run_dir: Path
    stop_flag: Callable[[], bool] = lambda: False  # the soak is being interrupted

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    def ended(self) -> bool:
        return self.replay.proc.poll() is not None

    def state(self) -> dict:
        try:
            return json.loads((self.run_dir / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def attempt(self) -> int:
        a = self.state().get("attempt", 1)
        return a if type(a) is int else 1

    def notices(self, since: float) -> list[dict]:
        return [n for n in records(self.run_dir / "notices.jsonl") if float(n.get("at") or 0) >= since]

    def last_step_time(self) -> float:
        """Wall clock of the worker's newest step record (0 before the first)."""
        recs = [r for r in records(self.field.live_metrics(self.run_id)) if "loss" in r and "event" not in r]
        return float(recs[-1].get("time") or 0) if recs else 0.0

    def training(self, fresh: float = 8.0) -> bool:
        """Steps are being recorded now and every node runs its rank."""
        if self.ended() or self.state().get("status") != "running":
            return False
        if time.time() - self.last_step_time() > fresh:
            return False
        return all(self.field.rank_pids(i) for i in range(len(self.field.cluster.nodes)))

    def wait(self, cond: Callable[[], object], bound: float, every: float = 0.5):
        """cond()'s first true value within `bound` seconds; None at the bound, or once the run ended or the
        soak is being stopped (cond is tried once more then)."""
        deadline = time.monotonic() + bound
        while True:
            got = cond()
            if got or self.ended() or self.stop_flag() or time.monotonic() >= deadline:
                return got or cond()
            time.sleep(every)

    def settle(self, bound: float = 150.0) -> None:
        """Until the run trains again (a step recorded after now) or ends; bounded."""
        t = time.time()
        self.wait(lambda: self.last_step_time() > t and self.training(), bound)


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): tells a pid reused later from the one seen."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()[19]


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for kv in env:
        if kv.startswith(b"RANK="):
            return int(kv[5:])
    return None


def _signal_same(pid: int, started: str | None, sig: int) -> bool:
    """Signal `pid` only while it is still the process seen at `started`."""
    if started is None or _start_time(pid) != started:
        return False
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def ssh_cut(live: Live, node: int, seconds: float) -> Fault:
    f = Fault("ssh", node, live.run_id, time.time(), detail={"planned_s": round(seconds, 1)})
    live.field.cut_ssh(node)
    t0 = time.monotonic()
    try:
        deadline = t0 + seconds
        while time.monotonic() < deadline and not live.stop_flag():
            time.sleep(0.25)  # the run may end meanwhile: the cut lasts as planned all the same
    finally:
        live.field.mend_ssh(node)
        f.duration = round(time.monotonic() - t0, 1)
    mended = time.time()

    def back() -> bool:  # reachable again, or the monitor gave up on it and relaunched
        ns = live.notices(f.at)
        unseen = not any(n["kind"] == "UNREACHABLE" and n.get("node") == node for n in ns)
        return unseen or any(n["kind"] in ("REACHABLE", "UNREACHABLE_BOUND") and n.get("node") == node
                             and float(n["at"]) >= mended - 1 for n in ns)

    live.wait(back, 40.0)
    live.settle()
    f.until = time.time()
    return f


def hang(live: Live, node: int, bound: float) -> Fault:
    """SIGSTOP one rank of `node` until the watchdog names a hang (or `bound` passes), then SIGCONT it if
    the relaunch has not ended it already."""
    pids = live.field.rank_pids(node)
    if not pids:
        raise LookupError(f"no rank runs on node {node}")
    pid = pids[0]
    started, rank = _start_time(pid), _rank_of(pid)
    f = Fault("hang", node, live.run_id, time.time(), detail={"pid": pid, "rank": rank})
    attempt = live.attempt()
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        got = live.wait(lambda: [n for n in live.notices(f.at) if n["kind"] == "HANG"], bound)
        f.detail["hang_after_s"] = round(time.monotonic() - t0, 1) if got else None
        if not got:  # what every rank's heartbeat says at the bound: the phase the others wait in
            f.detail["phases"] = heartbeat_phases(live)
        if got:  # with on_hang restart the next attempt comes; let the old rank be ended by it
            live.wait(lambda: live.attempt() > attempt, 90.0)
    finally:
        f.detail["continued"] = _signal_same(pid, started, signal.SIGCONT)
        f.duration = round(time.monotonic() - t0, 1)
    live.settle()
    f.until = time.time()
    return f


def heartbeat_phases(live: Live) -> dict[str, str]:
    """global rank -> the phase its newest heartbeat file names, read from every node's run directory."""
    out: dict[str, tuple[float, str]] = {}
    for i in range(len(live.field.cluster.nodes)):
        for p in (live.field.workdir(i) / ".qwen-tui" / "runs" / live.run_id).glob("**/heartbeat/rank-*.json"):
            try:
                b = json.loads(p.read_text())
                at = p.stat().st_mtime
            except (OSError, ValueError):
                continue  # being replaced
            r = str(b.get("rank"))
            if r not in out or at > out[r][0]:
                out[r] = (at, str(b.get("phase")))
    return {r: ph for r, (_, ph) in sorted(out.items())}


def _job_pids(live: Live, node: int) -> list[int]:
    """The node's torchrun agent and ranks (not the job's shell, which records their exit code)."""
    out = []
    for pid in live.field.cluster.job_pids(node):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"torch.distributed.run" in cmd or b"torchrun" in cmd or b"training.finetune" in cmd:
            out.append(pid)
    return out


def kill(live: Live, node: int) -> Fault:
    pids = _job_pids(live, node)
    if not pids:
        raise LookupError(f"no torchrun agent or rank runs on node {node}")
    f = Fault("kill", node, live.run_id, time.time(), detail={"pids": pids})
    attempt = live.attempt()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue  # it ended on its own just now
    live.wait(lambda: live.attempt() > attempt, 90.0)
    live.settle()
    f.until = time.time()
    return f


def throttle(live: Live, node: int, seconds: float, percent: int, tag: str) -> Fault:
    pids = live.field.rank_pids(node)
    if not pids:
        raise LookupError(f"no rank runs on node {node}")
    f = Fault("throttle", node, live.run_id, time.time(), detail={"percent": percent, "pids": pids,
                                                                   "planned_s": round(seconds, 1)})
    cg = CpuThrottle(tag, percent)
    t0 = time.monotonic()
    try:
        for pid in pids:
            try:
                cg.add(pid)
            except OSError:
                continue  # ended meanwhile
        deadline = t0 + seconds
        while time.monotonic() < deadline and not live.stop_flag() and not live.ended():
            time.sleep(0.25)
    finally:
        cg.remove()
        f.duration = round(time.monotonic() - t0, 1)
    live.wait(lambda: False, 8.0)  # a STRAGGLER_OVER, if any, comes a few logged steps later
    f.until = time.time()
    return f


def lost(live: Live, node: int, how: str, bound: float = 150.0) -> Fault:
    """The machine of `node` vanishes ("reset" or "silent": field_run.FieldCluster.vanish) until the run relaunches
    without it or ends (bounded), then comes back: what was frozen is killed, the firewall is as before."""
    if not live.field.rank_pids(node):
        raise LookupError(f"no rank runs on node {node}")
    f = Fault(f"lost-{how}", node, live.run_id, time.time(), detail={"how": how})
    attempt = live.attempt()
    frozen = live.field.vanish(node, how)
    t0 = time.monotonic()
    try:
        live.wait(lambda: live.attempt() > attempt, bound)
    finally:
        live.field.mend(node, frozen)
        f.duration = round(time.monotonic() - t0, 1)
    live.settle()
    f.until = time.time()
    return f
