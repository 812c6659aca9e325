"""The wizard's one style table: every colour a step shows is a role here, written with the Textual theme's
variables ($error, $warning, $success, ...), so choosing another theme (ctrl+p, "theme") recolours every step.
Textual resolves the variables itself in app.tcss; rich Text, rich Tables and DataTable cells need the colour
itself, which tone() takes from the running app's theme when the text is drawn."""

from __future__ import annotations

from rich.text import Text
from textual._context import active_app
from textual.color import Color, ColorParseError
from textual.notifications import SeverityLevel
from textual.theme import BUILTIN_THEMES

from ..base.levels import Level
from ..run.states import JobState, RunState
from ..wizard.state import BAD, LIVE, OK, WARN

# roles: what a colour says
ERROR = "bold $error"  # something is wrong: an error, a failed run or node
FAIL = "$error"  # a failed row or cell, in a table or a list that stays readable
WARNING = "$warning"  # look at this: a warning, something not checked or still under way
WARNING_STRONG = "bold $warning"
GOOD = "$success"  # fine: checked and passed, fits, running
GOOD_STRONG = "bold $success"
NOTE = "$text-primary"  # a figure or name to notice, neither good nor bad
NOTE_STRONG = "bold $text-primary"
MEMORY = "$primary"  # the second bar of a GPU row (its memory)
CURVE = "$text-success"  # the loss curve
QUIET = "dim"  # hints, units, what does not apply
BAR_EMPTY = "$panel"  # the unfilled part of a bar

LEVEL: dict[Level, str] = {Level.ERROR: ERROR, Level.WARNING: WARNING, Level.INFO: GOOD}

STEP: dict[str, tuple[str, str]] = {  # a step's status in the stepper: (mark, role)
    OK: ("✔", GOOD), WARN: ("!", WARNING), BAD: ("✘", ERROR), LIVE: ("▶", NOTE)}

JOB: dict[JobState, str] = {  # a node's part of the run, on its GPU panel
    JobState.RUNNING: GOOD, JobState.OK: GOOD_STRONG, JobState.FAILED: ERROR, JobState.LOST: ERROR,
    JobState.STOPPED: WARNING, JobState.PENDING: QUIET, JobState.STOPPING: WARNING,
    JobState.UNREACHABLE: WARNING_STRONG}

SEVERITY: dict[Level, SeverityLevel] = {  # a notification's (App.notify) for an issue of each level
    Level.ERROR: "error", Level.WARNING: "warning", Level.INFO: "information"}

OUTCOME: dict[RunState, str] = {RunState.OK: GOOD_STRONG, RunState.STOPPED: WARNING}  # anything else: ERROR


def level_style(level: Level | str) -> str:
    return tone(LEVEL.get(Level(level), ""))


def outcome_style(status: RunState | str) -> str:
    return tone(OUTCOME.get(RunState(status), ERROR))


def tone(spec: str) -> str:
    """A rich style for a spec written with theme variables ("bold $error" -> "bold #B93C5B"), from the running
    app's theme (the default theme's outside an app: a unit test drawing a widget's text)."""
    if "$" not in spec:
        return spec
    variables = _variables()
    return " ".join(_colour(w, variables) if w.startswith("$") else w for w in spec.split())


def styled(text: str, role: str) -> Text:
    """Text in a role's style (tone'd)."""
    return Text(text, style=tone(role))


def _variables() -> dict[str, str]:
    try:
        app = active_app.get()
    except LookupError:
        return _default()
    if not app.theme_variables:  # before the first stylesheet: the theme's own, as the app will use them
        app.get_css_variables()
    return app.theme_variables


_DEFAULT: dict[str, str] | None = None


def _default() -> dict[str, str]:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = BUILTIN_THEMES["textual-dark"].to_color_system().generate()
    return _DEFAULT


def _colour(word: str, variables: dict[str, str]) -> str:
    value = variables.get(word[1:], "")
    try:
        return Color.parse(value).hex6
    except ColorParseError:  # a variable that is no plain colour ("auto 60%"): the terminal's own colour
        return "default"
