"""A checkpoint asked of a running job from outside: SIGUSR2 to every rank (training/runtime/save_request.py), on
which the workers save the same step together and end quietly. qwen-tui asks for it when SLURM warns that the
job's time limit is near, so the job can be requeued and resume from that checkpoint.

The ranks are the ones their heartbeats name, read afresh on each node; only processes that prove they are the
run's job are signalled (nodes/jobs.py), and never a torchrun agent (SIGUSR2 would end it)."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ...nodes.jobs import members
from ..watch.watchdog import READ_BEATS, parse_beats

if TYPE_CHECKING:
    from ..launcher import Launcher

BOUND_S = 30.0  # every node asked in parallel


def ask_checkpoint(la: "Launcher") -> dict[int, str]:
    """node rank -> what came of asking its ranks ("asked N rank(s)" or why not)."""

    def one(rank: int) -> str:
        c, t, ref = la.plan.nodes[rank], la.transports[rank], la._ref(rank)
        if ref is None:
            return "no job recorded"
        res = t.run(["sh", "-c", READ_BEATS, "sh", c.heartbeat_dir], timeout=15)
        pids = {int(b["pid"]) for b in parse_beats(res.stdout).values() if type(b.get("pid")) is int}
        ranks = [p for p in members(ref, t.job_procs(ref.pid, ref.run_id)) if p.pid in pids]
        if not ranks:
            return "no training rank running"
        return f"asked {t.kill_procs(ranks, signal.SIGUSR2)} rank(s)"

    out: dict[int, str] = {}
    with ThreadPoolExecutor(max_workers=max(1, len(la.plan.nodes))) as ex:
        futs = {c.rank: ex.submit(one, c.rank) for c in la.plan.nodes}
        for rank, f in futs.items():
            try:
                out[rank] = f.result(timeout=BOUND_S)
            except Exception as e:  # per node: one that cannot be asked does not hide the others
                out[rank] = f"cannot ask: {type(e).__name__}: {e}"
    return out
