"""Shell quoting, on the ground floor: the plan (pure), the transports and the exports all
render argv lists as command lines, so the helper lives below them all. Nothing here runs
anything."""

from __future__ import annotations

import shlex
from collections.abc import Sequence


def quote_argv(argv: Sequence[str]) -> str:
    """One command line in which every argument is shlex-quoted (never pasted in)."""
    return " ".join(shlex.quote(a) for a in argv)

