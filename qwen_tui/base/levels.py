"""How loud something is, and the shape every issue shares: the advice on a preset (advice.core.Advice) and the
node checks' findings (nodes.checks.findings.Finding) are both an Issue with a Level, so one table prints both and
one comparison ranks them. Str-valued, so JSON, the check's --json and the notices read "error", "warning", "info"."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .strenum import StrEnum


class Level(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        """Higher is louder: info 0, warning 1, error 2."""
        return _RANK[self]

    @property
    def mark(self) -> str:
        """The sign a list puts before an issue of this level."""
        return _MARK[self]


_RANK = {Level.INFO: 0, Level.WARNING: 1, Level.ERROR: 2}
_MARK = {Level.INFO: "i", Level.WARNING: "!", Level.ERROR: "✘"}


def worst(levels: Iterable[Level | str]) -> Level | None:
    """The loudest of the levels; None for none."""
    found = [Level(lv) for lv in levels]
    return max(found, key=lambda lv: lv.rank) if found else None


def loudest_first(issue: "Issue") -> int:
    """Sort key: errors, then warnings, then infos (a stable sort keeps each level's own order)."""
    return -issue.level.rank


@dataclass(frozen=True)
class Issue:
    """Something to tell the user: how loud (level), a stable code (each in advice/codes.py or nodes/checks/codes.py,
    which the manual lists) and a one-line message with the figures behind it. A level given as its word ("error") is
    taken as the Level."""

    level: Level
    code: str
    message: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "level", Level(self.level))


@dataclass(frozen=True)
class CodeDoc:
    """What an Issue's code means, for the reader of the reference (docs/gen_reference.py renders every one):
    how loud it is, when it is raised and what fixes it. The message of each Issue carries its own figures; this
    says what holds for every Issue of the code."""

    levels: str  # "error", or "warning / error" where the figures decide
    when: str
    fix: str = ""  # what to do; empty where nothing needs doing (a note)

    def __post_init__(self) -> None:
        for word in self.levels.split(" / "):
            Level(word)  # a level that is not one fails at import, in every test

    @property
    def level_list(self) -> tuple[Level, ...]:
        return tuple(Level(w) for w in self.levels.split(" / "))
