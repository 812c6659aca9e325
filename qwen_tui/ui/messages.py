"""Messages between the screens, their workers and the App. Workers never touch
widgets: they post one of these and the handler (on the UI thread) updates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from textual.message import Message


class ChangePreset(Message):
    """A screen asks the App to change the preset: {"training.zero_stage": 3, ...}."""

    def __init__(self, changes: dict[str, Any], *, note: Optional[str] = None) -> None:
        super().__init__()
        self.changes = changes
        self.note = note


class StateChanged(Message):
    """The App tells the active screen that preset, facts or advice changed. Bursts coalesce."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, StateChanged)


class NodeProgress(Message):
    """One node's step in a parallel action (probe, connect, key install, net check)."""

    def __init__(self, action: str, index: int, status: str, *, facts: Any = None, error: Optional[str] = None) -> None:
        super().__init__()
        self.action, self.index, self.status, self.facts, self.error = action, index, status, facts, error


class ActionDone(Message):
    def __init__(self, action: str, result: Any = None, error: Optional[str] = None) -> None:
        super().__init__()
        self.action, self.result, self.error = action, result, error


class GpuSampleMsg(Message):
    """A node's GPU/CPU sample. A newer sample of the same node replaces an unhandled one."""

    def __init__(self, sample: Any) -> None:
        super().__init__()
        self.sample = sample

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, GpuSampleMsg) and message.sample.rank == self.sample.rank


@dataclass
class LaunchEvent(Message):
    """A step of the launch API (run.api: Stage, Connected, Checked, Planned, AlreadyEnded or
    Failure), from a Run worker; the screen draws it."""

    event: Any


@dataclass
class RunStarted(Message):
    """The job runs (launched, or found again by attach): the Launcher to follow and stop."""

    launcher: Any


@dataclass
class RunUpdate(Message):
    """A run.api.Snapshot of the run (node states, progress, the selected node's log tail). Coalesces."""

    snapshot: Any

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunUpdate)


@dataclass
class RunEnded(Message):
    """The run's outcome (run.launcher.RunOutcome)."""

    outcome: Any
