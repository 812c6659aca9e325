"""The states a run and each node's part in it go through, named once (as torch elastic's WorkerState names a
worker group's). Str-valued: state.json, `qwen-tui runs --json`, the exit codes and the screens keep the words
they always had, and a state read back from a file compares equal to its member."""

from __future__ import annotations

from ..base.strenum import StrEnum


class JobState(StrEnum):
    """One node's part of a run (launcher.NodeState.status)."""

    PENDING = "pending"  # not started yet
    RUNNING = "running"
    UNREACHABLE = "unreachable"  # running, but the monitor cannot read the node now (shown, never stored)
    STOPPING = "stopping"  # a stop is under way there (shown while stop_all runs)
    OK = "ok"  # its processes ended with 0
    FAILED = "failed"
    STOPPED = "stopped"  # ended by a stop
    LOST = "lost"  # the monitor gave up on reading it

    @property
    def ended(self) -> bool:
        return self in (JobState.OK, JobState.FAILED, JobState.STOPPED, JobState.LOST)


class RunState(StrEnum):
    """The run as a whole: state.json's status, a RunOutcome's, what a face shows."""

    PENDING = "pending"  # submitted to a scheduler (SLURM), waiting for its nodes
    STARTING = "starting"  # a face is connecting, checking and launching (never written)
    RUNNING = "running"
    RESTARTING = "restarting"  # between two attempts (run/recovery/restarts.py)
    OK = "ok"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def exit_code(self) -> int:
        """The command's exit status for a run that ended so: 0 ok, 130 stopped (as after Ctrl-C), else 1."""
        return {RunState.OK: 0, RunState.STOPPED: 130}.get(self, 1)


FINAL = (RunState.OK, RunState.FAILED, RunState.STOPPED, RunState.LOST)  # a run in one of these has ended
