"""What the monitor noticed about a running job beyond each node's state: a node it could not read and
then could again, a hang and where its stacks are, a slow node and the evidence. Every face shows the
same notices (the launch API's Snapshot carries them); each is also appended to the run directory's
notices.jsonl, so that `qwen-tui attach` shows what happened before it attached."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from ..base.levels import Level

NOTICES_NAME = "notices.jsonl"

# The kinds, and how loud each is (a face colours each level its way: ui/styles.py, run/styles.py).
UNREACHABLE, REACHABLE, GIVEN_UP = "UNREACHABLE", "REACHABLE", "UNREACHABLE_BOUND"
HANG, HANG_OVER = "HANG", "HANG_OVER"
STRAGGLER, STRAGGLER_OVER = "STRAGGLER", "STRAGGLER_OVER"
LOST = "MACHINE_LOST"  # a node unreachable whose training peers lost it too (run/blame.py)
LEVELS = {UNREACHABLE: Level.WARNING, REACHABLE: Level.INFO, GIVEN_UP: Level.ERROR, HANG: Level.ERROR,
          HANG_OVER: Level.INFO, STRAGGLER: Level.WARNING, STRAGGLER_OVER: Level.INFO, LOST: Level.ERROR}


@dataclass(frozen=True)
class Notice:
    kind: str
    text: str  # one line, complete: "node 1 (gpu-2) unreachable: ...; training goes on"
    node: Optional[int] = None
    at: float = field(default_factory=time.time)
    attempt: int = 1
    details: dict = field(default_factory=dict)  # stacks directory, culprit rank, figures

    @property
    def level(self) -> Level:
        return LEVELS.get(self.kind, Level.INFO)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Optional["Notice"]:
        """None for a record that is not a notice (a damaged line is skipped, never fatal)."""
        if not isinstance(d, dict) or not isinstance(d.get("kind"), str) or not isinstance(d.get("text"), str):
            return None
        node = d.get("node")
        at = d.get("at")
        attempt = d.get("attempt")
        details = d.get("details")
        return cls(d["kind"], d["text"], node if type(node) is int else None,
                   float(at) if isinstance(at, (int, float)) else 0.0,
                   attempt if type(attempt) is int else 1, details if isinstance(details, dict) else {})


def append_notice(run_dir: Path, n: Notice) -> None:
    """One line in the run directory's notices.jsonl (0600, appended whole: one write of one line)."""
    fd = os.open(run_dir / NOTICES_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(n.to_dict(), sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def read_notices(run_dir: Path) -> list[Notice]:
    """Every notice recorded for the run, oldest first; a missing file is none."""
    try:
        text = (run_dir / NOTICES_NAME).read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            n = Notice.from_dict(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash: the rest still count
        if n is not None:
            out.append(n)
    return out
