"""The headless face of a run: a rich live view of node states and the master's
loss, used by `qwen-tui replay` and `qwen-tui attach`."""

from __future__ import annotations

import signal
from typing import Optional

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .gpuseries import NodeWatch, reports_to_tracker
from .launcher import Launcher, RunOutcome
from .metrics import fmt_duration

_STYLE = {"running": "cyan", "ok": "green", "failed": "bold red", "lost": "bold red", "stopped": "yellow"}
_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 40) -> str:
    if not values:
        return ""
    vals = values[-width:]
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    return "".join(_BARS[min(len(_BARS) - 1, int((v - lo) / span * (len(_BARS) - 1)))] for v in vals)


def render(la: Launcher) -> Group:
    prog = la.metrics.progress
    nodes = Table(title=f"run {la.plan.run_id}", expand=False)
    for col in ("node", "host", "procs", "status", "pid", "note"):
        nodes.add_column(col)
    for c in la.plan.nodes:
        st = la.nodes[c.rank]
        nodes.add_row(str(c.rank), c.label, str(c.nproc), Text(st.status, style=_STYLE.get(st.status, "")),
                      str(st.pid or "-"), st.error or (f"rc {st.rc}" if st.rc is not None else ""))
    last = prog.last or {}
    total = prog.total_steps
    step = last.get("step", 0)
    line = Text()
    line.append(f"step {step}/{total or '?'}  ")
    if "loss" in last:
        first = prog.losses[0] if prog.losses else last["loss"]
        line.append(f"loss {last['loss']:.4f} (first {first:.4f})  ")
    ev = prog.last_eval
    if ev is not None:
        line.append(f"eval loss {ev['eval_loss']:.4f} (step {ev.get('step', '?')})  ", style="bold")
    if "learning_rate" in last:
        line.append(f"lr {last['learning_rate']:.2e}  ")
    if "tokens_per_second" in last:
        line.append(f"{last['tokens_per_second']:.0f} tok/s  ")
    line.append(f"ETA {fmt_duration(prog.eta_seconds())}")
    parts: list = [nodes, line]
    if prog.losses:
        parts.append(Text("loss " + sparkline(prog.losses), style="magenta"))
    if prog.start is None:
        parts.append(Text("waiting for every node to join the rendezvous and the worker to start…", style="dim"))
    return Group(*parts)


def follow(la: Launcher, console: Optional[Console] = None, *, interval: float = 0.5,
           max_seconds: Optional[float] = None) -> RunOutcome:
    """Watch until the run ends. Ctrl-C or SIGTERM stops every node of the run."""
    console = console or Console()

    def _on_signal(signum, frame):  # noqa: ARG001 - signal handler signature
        la.request_stop()

    old_int = signal.signal(signal.SIGINT, _on_signal)
    old_term = signal.signal(signal.SIGTERM, _on_signal)
    # A worker that reports to a tracker gets every node's GPU load from the monitor (run.gpuseries).
    watch = NodeWatch(la) if la.plan.nodes and reports_to_tracker(la.plan.nodes[0].argv) else None
    if watch is not None:
        watch.start()
    try:
        with Live(render(la), console=console, refresh_per_second=4, transient=False) as live:
            out = la.wait(interval=interval, on_update=lambda l: live.update(render(l)), max_seconds=max_seconds)
            live.update(render(la))
        console.print()
    finally:
        if watch is not None:
            watch.stop(flush_last=False)
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
    style = {"ok": "bold green", "stopped": "yellow"}.get(out.status, "bold red")
    console.print(Text(out.message, style=style))
    if out.failed_rank is not None:
        console.print(f"last lines of node {out.failed_rank} ({la.plan.nodes[out.failed_rank].label}):")
        for ln in la.log_tail(out.failed_rank, 15):
            console.print("  " + ln, markup=False, highlight=False)
    losses = la.metrics.progress.losses
    if losses:
        console.print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} logged steps")
    ev = la.metrics.progress.evals
    if ev:
        first = f" (first {ev[0]['eval_loss']:.4f} at step {ev[0].get('step')})" if len(ev) > 1 else ""
        console.print(f"last eval loss {ev[-1]['eval_loss']:.4f} at step {ev[-1].get('step')}{first}")
    return out
