"""How the commands colour their terminal output (rich): the one table of level, state and role -> rich style.
The wizard takes its colours from the Textual theme instead (ui/styles.py)."""

from __future__ import annotations

from ..base.levels import Level
from ..run.states import JobState, RunState

# roles
BAD = "bold red"  # an error, a failure
FAIL = "red"  # a failed cell or line among others
WARN = "yellow"  # look at this; under way; not checked
WARN_STRONG = "bold yellow"
GOOD = "green"  # checked and fine
GOOD_STRONG = "bold green"
NOTE = "cyan"  # a figure to notice, neither good nor bad
CURVE = "magenta"  # the loss sparkline
QUIET = "dim"

LEVEL: dict[Level, str] = {Level.ERROR: BAD, Level.WARNING: WARN, Level.INFO: GOOD}
# the check's matrix cells beside the levels: ok, does not apply, could not run
VERDICT: dict[str, str] = {"ok": GOOD, "-": QUIET, "not checked": WARN}
JOB: dict[JobState, str] = {JobState.RUNNING: NOTE, JobState.OK: GOOD, JobState.FAILED: BAD, JobState.LOST: BAD,
                            JobState.STOPPED: WARN, JobState.UNREACHABLE: WARN_STRONG}
OUTCOME: dict[RunState, str] = {RunState.OK: GOOD_STRONG, RunState.STOPPED: WARN}  # anything else: BAD


def level_style(level: Level | str) -> str:
    return LEVEL.get(Level(level), "")


def outcome_style(status: RunState | str) -> str:
    return OUTCOME.get(RunState(status), BAD)
