"""Shell quoting on the ground floor: the plan (pure) and the transports both render
argv lists as one quoted command line, so the helper lives below both."""

from __future__ import annotations

import shlex
from typing import Sequence


def quote_argv(argv: Sequence[str]) -> str:
    """One command line in which every argument is shlex-quoted (never pasted in)."""
    return " ".join(shlex.quote(a) for a in argv)
