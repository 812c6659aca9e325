"""Messages between the screens, their workers and the App, as dataclasses (typed fields,
the way Textual lets them be). Workers never touch widgets: they post one of these and the
handler (on the UI thread) updates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from textual.message import Message


@dataclass(eq=False)  # a message is itself, not its fields (as textual.Message is)
class ChangePreset(Message):
    """A screen asks the App to change the preset: {"training.zero_stage": 3, ...}."""

    changes: dict[str, Any]
    note: Optional[str] = field(default=None, kw_only=True)


class StateChanged(Message):
    """The App tells the active screen that preset, facts or advice changed. Bursts coalesce."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, StateChanged)


@dataclass(eq=False)
class NodeProgress(Message):
    """One node's step in a parallel action (probe, connect, key install, net check)."""

    action: str
    index: int
    status: str
    facts: Any = field(default=None, kw_only=True)
    error: Optional[str] = field(default=None, kw_only=True)
    fix: str = field(default="", kw_only=True)  # what to do about the error
    connection_failed: bool = field(default=False, kw_only=True)  # the node could not be logged into


@dataclass(eq=False)
class ActionDone(Message):
    """A worker's action ended: its result, or the error to show."""

    action: str
    result: Any = None
    error: Optional[str] = None


@dataclass(eq=False)
class GpuSampleMsg(Message):
    """A node's GPU/CPU sample. A newer sample of the same node replaces an unhandled one."""

    sample: Any

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, GpuSampleMsg) and message.sample.rank == self.sample.rank


@dataclass(eq=False)
class LaunchEvent(Message):
    """A step of the launch API (run.api: Stage, Connected, Checked, Planned, AlreadyEnded or
    Failure), from a Run worker; the screen draws it."""

    event: Any


@dataclass(eq=False)
class RunStarted(Message):
    """The job runs (launched, or found again by attach): the Launcher to follow and stop."""

    launcher: Any


@dataclass(eq=False)
class RunUpdate(Message):
    """A run.api.Snapshot of the run (node states, progress, the selected node's log tail). Coalesces."""

    snapshot: Any

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunUpdate)


@dataclass(eq=False)
class RunNote(Message):
    """A line about the run between its attempts (run.restarts: which node failed, what the next attempt does)."""

    text: str


@dataclass(eq=False)
class RunStopping(Message):
    """A stop in progress (run.api.Stopping: where each node's stop is). Coalesces."""

    stopping: Any

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunStopping)


@dataclass(eq=False)
class RunEnded(Message):
    """The run's outcome (run.launcher.RunOutcome)."""

    outcome: Any
