"""Follow the worker's metrics.jsonl (append-only, one JSON object a line) from the
master node, incrementally, through a Transport, and keep a summary for the views.
When the master is remote, what is read is also kept in the run directory."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any


def preference_words(rec: dict[str, Any], prefix: str = "") -> str | None:
    """The rewards of a DPO step record (prefix "eval_" for an eval record) in words; None without them."""
    keys = [f"{prefix}rewards_{k}" for k in ("accuracy", "margin", "chosen", "rejected")]
    if not all(isinstance(rec.get(k), (int, float)) for k in keys):
        return None
    acc, margin, chosen, rejected = (rec[k] for k in keys)
    return f"reward accuracy {acc:.0%}, margin {margin:.3f} (chosen {chosen:+.3f}, rejected {rejected:+.3f})"


@dataclass
class TrainingProgress:
    start: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # checkpoints, evals, ...

    @property
    def total_steps(self) -> int | None:
        return self.start.get("total_steps") if self.start else None

    @property
    def last(self) -> dict[str, Any] | None:
        return self.steps[-1] if self.steps else None

    @property
    def losses(self) -> list[float]:
        return [s["loss"] for s in self.steps if isinstance(s.get("loss"), (int, float))]

    @property
    def evals(self) -> list[dict[str, Any]]:
        """The worker's {"event": "eval", "step", "eval_loss"} records, in order."""
        return [e for e in self.events if e.get("event") == "eval" and isinstance(e.get("eval_loss"), (int, float))]

    @property
    def last_eval(self) -> dict[str, Any] | None:
        ev = self.evals
        return ev[-1] if ev else None

    @property
    def preference(self) -> str | None:
        """A DPO run's last rewards in words ("reward accuracy 75%, margin 1.09 (chosen +0.29, rejected -0.80)"), or
        None for supervised fine-tuning."""
        return preference_words(self.last or {})

    @property
    def accuracies(self) -> list[float]:
        """A DPO run's reward accuracy at every logged step (empty for supervised fine-tuning)."""
        return [s["rewards_accuracy"] for s in self.steps if isinstance(s.get("rewards_accuracy"), (int, float))]

    def eta_seconds(self) -> float | None:
        last, total = self.last, self.total_steps
        if not last or not total or len(self.steps) < 2:
            return None
        t0, t1 = self.steps[0].get("time"), last.get("time")
        s0, s1 = self.steps[0].get("step"), last.get("step")
        if None in (t0, t1, s0, s1) or s1 <= s0:
            return None
        return max(0.0, (total - s1) * (t1 - t0) / (s1 - s0))

    def add(self, rec: dict[str, Any]) -> None:
        ev = rec.get("event")
        if ev == "start":
            self.start, self.end = rec, None  # a relaunch starts again: an earlier attempt's end is not this one's
        elif ev == "end":
            self.end = rec
        elif ev is None and "step" in rec:
            self.steps.append(rec)
        else:
            self.events.append(rec)


def read_progress(path: str | os.PathLike[str]) -> TrainingProgress:
    """The progress a metrics file records (a run directory's copy, say); a damaged line is skipped, a missing file
    records nothing."""
    progress = TrainingProgress()
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        return progress
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            progress.add(rec)
    return progress


def loss_summary(progress: TrainingProgress) -> list[str]:
    """How the loss went, in a line or two: the end of a followed run, or attach on one that has ended."""
    out = []
    losses = progress.losses
    if losses:
        out.append(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} logged steps")
    ev = progress.evals
    if ev:
        first = f" (first {ev[0]['eval_loss']:.4f} at step {ev[0].get('step')})" if len(ev) > 1 else ""
        out.append(f"last eval loss {ev[-1]['eval_loss']:.4f} at step {ev[-1].get('step')}{first}")
    if progress.preference:  # DPO: the rewards of the last step and of the last evaluation
        out.append(f"last step: {progress.preference}")
    if ev and preference_words(ev[-1], "eval_"):
        out.append(f"last eval: {preference_words(ev[-1], 'eval_')}")
    return out


class MetricsFollower:
    """Reads only what was appended since the last call; a partial last line waits.
    `keep`: a local file that gets every byte read, at the offset it was read from plus `keep_at`
    (a follower re-attached from offset 0 rewrites the same bytes: no duplicates; a relaunch on
    another master appends its file after what the first master wrote)."""

    def __init__(self, transport, path: str, keep: str | None = None, keep_at: int = 0):
        self.transport = transport
        self.path = path
        self.keep = keep
        self.keep_at = keep_at
        self.offset = 0
        self._partial = b""
        self.progress = TrainingProgress()
        self.bad_lines = 0

    def poll(self) -> list[dict[str, Any]]:
        chunk = self.transport.read_file(self.path, offset=self.offset)
        if not chunk:
            return []
        if self.keep:
            fd = os.open(self.keep, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.pwrite(fd, chunk, self.keep_at + self.offset)
            finally:
                os.close(fd)
        self.offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        out = []
        for ln in lines:
            if not ln.strip():
                continue
            try:
                rec = json.loads(ln)
            except json.JSONDecodeError:
                self.bad_lines += 1
                continue
            if isinstance(rec, dict):
                self.progress.add(rec)
                out.append(rec)
        return out


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
