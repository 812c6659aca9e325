"""What a screen, a log or a printed plan may show of a value.

Environment variables whose names look secret (HF_TOKEN, WANDB_API_KEY, ...) are
shown as `***`; the value itself lives only in the preset, the run's 0600 copy of
it and the job's environment. Every shown value has its control characters
escaped, so a value cannot move the cursor or clear the terminal that prints it.
"""

from __future__ import annotations

import re

MASK = "***"
_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def is_secret(name: str) -> bool:
    return bool(_SECRET.search(name))


def printable(s: str) -> str:
    """`s` with every non-printable character escaped as Python writes it (\\n, \\x1b, \\u2028)."""
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def shown(name: str, value: str) -> str:
    return MASK if is_secret(name) else printable(value)


def shown_env(env: dict[str, str]) -> dict[str, str]:
    return {k: shown(k, v) for k, v in env.items()}
