"""StrEnum on every Python qwen-tui runs on: the standard one from 3.11, the same by hand on 3.10 (members that are
their str value, print as it and compare equal to it), so that JSON, --json and the notices read "error", "ok"."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:
    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)

__all__ = ["StrEnum"]
