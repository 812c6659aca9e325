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

from ...base.levels import CodeDoc, Level

NOTICES_NAME = "notices.jsonl"

# The kinds, what each says and how loud it is (a face colours each level its way: ui/styles.py, cli/styles.py);
# the manual's reference is generated from KINDS (docs/gen_reference.py).
UNREACHABLE, REACHABLE, GIVEN_UP = "UNREACHABLE", "REACHABLE", "UNREACHABLE_BOUND"
HANG, HANG_OVER = "HANG", "HANG_OVER"
STRAGGLER, STRAGGLER_OVER = "STRAGGLER", "STRAGGLER_OVER"
LOST = "MACHINE_LOST"  # a node unreachable whose training peers lost it too (run/watch/blame.py)
KINDS = {
    UNREACHABLE: CodeDoc("warning", "a read of a running node failed or stayed unanswered for 8 s: qwen-tui drops its "
                         "SSH connection and retries with backoff; the node's training goes on",
                         "nothing, for a blip; past `monitor.unreachable_timeout` the node is given up on (below)"),
    REACHABLE: CodeDoc("info", "a node that was unreachable answers again; its log and the master's metrics are read "
                       "on from where they stopped"),
    GIVEN_UP: CodeDoc("error", "a node stayed unreachable past `monitor.unreachable_timeout`: with `on_unreachable: "
                      "stop` every node is stopped (cause UNREACHABLE, and `training.restarts` may relaunch without "
                      "it); with `keep` the run goes on", "the node's network or sshd; `monitor.unreachable_timeout` "
                      "for networks that blink longer"),
    HANG: CodeDoc("error", "no step finished within the hang bound (`monitor.hang_timeout`, default 5 x the median "
                  "step, at least 120 s): names the node, rank and phase by the strongest evidence, and every rank's "
                  "stack is in the run directory's `stacks/`", "read the named rank's stack; `monitor.on_hang: "
                  "restart` relaunches from the last checkpoint"),
    HANG_OVER: CodeDoc("info", "steps finish again after a hang was called"),
    STRAGGLER: CodeDoc("warning", "a node's compute time per step exceeded the other nodes' median by "
                       "`monitor.straggler_threshold` (and 50 ms) for `monitor.straggler_steps` logged steps; with "
                       "the evidence at hand (GPU clocks and temperature, CPU load, the link to the master)",
                       "the evidence's cause: a throttled GPU, a busy CPU, a slow link; or leave the node out"),
    STRAGGLER_OVER: CodeDoc("info", "the straggler keeps pace again"),
    LOST: CodeDoc("error", "a node unreachable over SSH while its training peers lost it too: the others failed with "
                  "communication errors, or their ranks, alive, all held one phase past the stall bound (5 step times, "
                  "at least 10 s; 5 of the run's saves in a checkpoint): named at once, not after "
                  "`monitor.unreachable_timeout`, and left out of the relaunch", "the machine itself (power, kernel "
                  "log, its link); `training.restarts` with `exclude_failed` goes on without it"),
}
LEVELS = {kind: doc.level_list[0] for kind, doc in KINDS.items()}


@dataclass(frozen=True)
class Notice:
    kind: str
    text: str  # one line, complete: "node 1 (gpu-2) unreachable: ...; training goes on"
    node: int | None = None
    at: float = field(default_factory=time.time)
    attempt: int = 1
    details: dict = field(default_factory=dict)  # stacks directory, culprit rank, figures

    @property
    def level(self) -> Level:
        return LEVELS.get(self.kind, Level.INFO)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Notice" | None:
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
