"""The launch API's events (run/api.py): what launch(), attach(), checking() and follow() yield,
typed, for every face to render."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..base.levels import Level
from ..cluster.facts import ClusterFacts
from ..plan.launch import LaunchPlan
from .launcher import Launcher, RunOutcome
from .states import JobState, RunState
from .watch.metrics import TrainingProgress
from .watch.notices import Notice

if TYPE_CHECKING:
    from ..nodes.checks.runner import CheckReport


@dataclass(frozen=True)
class Stage:
    """A step begins: connect, check, rehearsal, launch or attach."""

    name: str
    text: str


@dataclass(frozen=True)
class Connected:
    """Every node answered; node index -> its label."""

    labels: dict[int, str]


@dataclass(frozen=True)
class CheckProgress:
    """A node check begins (`node` None: `text` says what it does) or one node's outcome of it,
    as it comes: what a face shows while the checks run."""

    check: str
    node: int | None
    text: str


@dataclass
class CheckResult:
    """What the launch checks found: the facts (for the plan and the run directory), the advice and
    the node checks' findings together (each (code, node) said once; each item has level, code,
    message and fix), and the node x check report (check.json; None on one machine). `checks`:
    the node checks' own report (its matrix and findings, as `qwen-tui check` prints them)."""

    facts: ClusterFacts
    items: list = field(default_factory=list)
    report: dict | None = None
    checks: CheckReport | None = None

    @property
    def errors(self) -> list:
        return [a for a in self.items if a.level == Level.ERROR]


@dataclass(frozen=True)
class Checked:
    result: CheckResult


@dataclass(frozen=True)
class Planned:
    plan: LaunchPlan


@dataclass(frozen=True)
class Started:
    """The job runs on every node (launched, or found again by attach): follow it, stop it."""

    launcher: Launcher


@dataclass(frozen=True)
class AlreadyEnded:
    """attach found a run that had ended: nothing to follow or stop."""

    run_id: str
    status: RunState
    message: str
    notices: tuple[Notice, ...] = ()  # what the monitor noticed while it ran (a hang and its stacks, ...)


@dataclass(frozen=True)
class Failure:
    """A step could not go on. `nodes`: node index -> what went wrong there, where it is per node;
    `items`: the check errors that blocked a launch."""

    stage: str
    cause: str
    fix: str = ""
    nodes: dict[int, str] = field(default_factory=dict)
    items: tuple = ()

    @property
    def message(self) -> str:
        return self.cause + (f"\nfix: {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class Snapshot:
    """A copy of a running job's state for a face to draw (never the live objects)."""

    nodes: dict[int, tuple[JobState, str | None]]  # rank -> (state, error); UNREACHABLE while it cannot be read
    progress: TrainingProgress
    log: list[str] = field(default_factory=list)
    log_rank: int | None = None
    notices: tuple[Notice, ...] = ()  # everything the monitor noticed so far, oldest first (run/watch/notices.py)
    notes: dict[int, str] = field(default_factory=dict)  # rank -> one line beside the node (compute time, ...)
    hung: int | None = None  # the node a hang called now is blamed on (its panel and row say so; no ETA then)


@dataclass(frozen=True)
class Stopping:
    """A stop in progress (it can take seconds: the workers are asked, waited for, then killed):
    node index -> where its stop is; `labels` names the nodes."""

    nodes: dict[int, str]
    labels: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def text(self) -> str:
        parts = [f"node {r}" + (f" ({self.labels[r]})" if r in self.labels else "") + f" {what}"
                 for r, what in sorted(self.nodes.items())]
        if not parts:
            return "stopping every node…"
        return f"stopping ({self.seconds:.0f} s): " + "; ".join(parts)


@dataclass(frozen=True)
class Ended:
    outcome: RunOutcome


Event = (Stage | CheckProgress | Connected | Checked | Planned | Started | AlreadyEnded | Failure | Snapshot | Stopping
         | Ended)
