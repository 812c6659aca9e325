"""Waiting on a Launcher driven directly (qwen_tui.run.launcher), as the cluster tests drive it."""

from __future__ import annotations

import time


def wait_steps(la, n: int, bound: float) -> None:
    """Until the run has logged `n` steps; fails at once if the launcher reports an outcome first, and names every
    node's log tail at the bound."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        out = la.poll()
        assert out is None, out.message
        if len(la.metrics.progress.steps) >= n:
            return
        time.sleep(0.3)
    raise AssertionError(f"no {n} steps within {bound:g}s: {[la.log_tail(c.rank) for c in la.plan.nodes]}")
