"""Messages between the screens, their workers and the App, as dataclasses (typed fields,
the way Textual lets them be). Workers never touch widgets: they post one of these and the
handler (on the UI thread) updates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from textual.message import Message

if TYPE_CHECKING:  # the annotations only: the run's modules load when a run starts, not with the first paint
    from ..cluster.facts import ClusterFacts, NodeFacts
    from ..nodes.checks.findings import Finding
    from ..run.events import Event, Snapshot, Stopping
    from ..run.launcher import Launcher, RunOutcome
    from ..run.watch.gpumon import NodeSample
    from ..wizard.state import ProbeState, SshState

JsonDict = dict[str, object]  # what a node's JSON tool answered, as read


@dataclass(eq=False)  # a message is itself, not its fields (as textual.Message is)
class ChangePreset(Message):
    """A screen asks the App to change the preset: {"training.zero_stage": 3, ...}."""

    changes: dict[str, object]  # dotted preset path -> new value (Preset.with_changes)
    note: str | None = field(default=None, kw_only=True)


class StateChanged(Message):
    """The App tells the active screen that preset, facts or advice changed. Bursts coalesce."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, StateChanged)


@dataclass(eq=False)
class ProbeProgress(Message):
    """One node's step in the probe: connecting, probing, ok (with its facts) or error (with why)."""

    index: int
    state: ProbeState
    facts: NodeFacts | None = field(default=None, kw_only=True)
    error: str | None = field(default=None, kw_only=True)
    fix: str = field(default="", kw_only=True)  # what to do about the error
    connection_failed: bool = field(default=False, kw_only=True)  # the node could not be logged into


@dataclass(eq=False)
class SshProgress(Message):
    """One node's step in connecting: connecting, connected (with its host key) or error (with why)."""

    index: int
    state: SshState
    host_key: str | None = field(default=None, kw_only=True)
    error: str | None = field(default=None, kw_only=True)
    fix: str = field(default="", kw_only=True)  # what to do about the error


@dataclass(eq=False)
class NetProgress(Message):
    """What one node (or, with node -1, the cluster) answered to a network check under way."""

    node: int
    check: str
    text: str


@dataclass(eq=False)
class ActionDone(Message):
    """A worker's action that brings nothing back ended (probe, ssh): with the error to show, if any."""

    action: str
    error: str | None = None


@dataclass(eq=False)
class NetChecked(Message):
    """The network checks ended: the facts and findings they brought, or why they could not run."""

    facts: ClusterFacts | None = None
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None


@dataclass(eq=False)
class NetOneChecked(Message):
    """One network check (ports, firewall or bandwidth: `which`) ended: what it found, or why it could not run."""

    which: str
    facts: ClusterFacts | None = None
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None


@dataclass(eq=False)
class Synced(Message):
    """Copying what the nodes lack from the master ended: a line per node and kind, and how many copies differ."""

    lines: list[str] = field(default_factory=list)
    differ: int = 0
    error: str | None = None


@dataclass(eq=False)
class DataPreviewed(Message):
    """The data preview ended: the preset it previewed (as JSON, to tell when it goes stale) and the report."""

    preset_json: str = ""
    report: JsonDict = field(default_factory=dict)
    error: str | None = None


@dataclass(eq=False)
class GpuSampleMsg(Message):
    """A node's GPU/CPU sample. A newer sample of the same node replaces an unhandled one."""

    sample: NodeSample

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, GpuSampleMsg) and message.sample.rank == self.sample.rank


@dataclass(eq=False)
class LaunchEvent(Message):
    """A step of the launch API (run.api: Stage, Connected, Checked, Planned, AlreadyEnded or
    Failure), from a Run worker; the screen draws it."""

    event: Event


@dataclass(eq=False)
class RunStarted(Message):
    """The job runs (launched, or found again by attach): the Launcher to follow and stop."""

    launcher: Launcher


@dataclass(eq=False)
class RunUpdate(Message):
    """A run.api.Snapshot of the run (node states, progress, the selected node's log tail). Coalesces."""

    snapshot: Snapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunUpdate)


@dataclass(eq=False)
class RunNote(Message):
    """A line about the run between its attempts (run.recovery.restarts: which node failed, what the next attempt
    does)."""

    text: str


@dataclass(eq=False)
class RunStopping(Message):
    """A stop in progress (run.api.Stopping: where each node's stop is). Coalesces."""

    stopping: Stopping

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunStopping)


@dataclass(eq=False)
class RunEnded(Message):
    """The run's outcome (run.launcher.RunOutcome)."""

    outcome: RunOutcome


@dataclass(eq=False)
class JobQueued(Message):
    """SLURM's word on a submitted run's job (run.slurm.job.Queued: PENDING and why, RUNNING and where)."""

    queued: Any


@dataclass(eq=False)
class JobLines(Message):
    """Lines the batch job printed (its own qwen-tui's checks and plan)."""

    lines: tuple[str, ...]
