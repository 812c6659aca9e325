"""Refused values said in plain words: pydantic's messages ("Input should be a valid integer, unable to
parse string as an integer") rewritten as "port: must be a whole number, got 'abc'", naming the field as
the form labels it. Plain text, no Textual: the wizard's forms and any other face use it."""

from __future__ import annotations

import re
from typing import Any

# (pattern on pydantic's message, plain words; groups of the pattern fill {0}, {1}...)
_RULES: list[tuple[str, str]] = [
    (r"Input should be a valid integer, got a number with a fractional part", "must be a whole number"),
    (r"Input should be a valid integer.*", "must be a whole number"),
    (r"Input should be a finite number", "must be a number"),
    (r"Input should be a valid number.*", "must be a number (like 0.0002 or 2e-4)"),
    (r"Input should be a valid boolean.*", "must be true or false"),
    (r"Input should be a valid string", "must be text"),
    (r"Input should be a valid list", "must be a list"),
    (r"Input should be a valid dictionary.*", "must be a mapping (key: value lines)"),
    (r"Input should be greater than or equal to (\S+)", "must be at least {0}"),
    (r"Input should be less than or equal to (\S+)", "must be at most {0}"),
    (r"Input should be greater than (\S+)", "must be more than {0}"),
    (r"Input should be less than (\S+)", "must be less than {0}"),
    (r"String should have at least 1 character", "must not be empty"),
    (r"String should have at least (\d+) characters", "needs at least {0} characters"),
    (r"String should have at most (\d+) characters", "may have at most {0} characters"),
    (r"List should have at least 1 item.*", "needs at least one entry"),
    (r"Input should be (.+)", "must be one of {0}"),  # Literal choices: 'full', 'lora' or 'qlora'
    (r"Extra inputs are not permitted", "is not a setting qwen-tui knows"),
    (r"Field required", "is required"),
]


def plain_message(message: str) -> str:
    """One pydantic message in plain words (a message that is already plain comes back as it was)."""
    msg = message.strip().removeprefix("Value error, ")
    for pattern, words in _RULES:
        m = re.fullmatch(pattern, msg)
        if m:
            return words.format(*m.groups())
    return msg


def field_name(path: str, labels: dict[str, str] | None = None) -> str:
    """What the person knows the field as: the form's label, else `node 2 port` for a node's field,
    else the dotted path."""
    labels = labels or {}
    if path in labels:
        return labels[path]
    m = re.fullmatch(r"cluster\.nodes\.(\d+)\.(\w+)", path)
    if m:
        return f"node {m.group(1)} {labels.get(m.group(2), m.group(2))}"
    return labels.get(path.rsplit(".", 1)[-1], path) if "." not in path else path


def plain(path: str, message: str, value: Any = None, labels: dict[str, str] | None = None) -> str:
    """`label: plain message, got 'value'`: what a form shows under a refused value."""
    words = plain_message(message)
    got = f", got {value!r}" if value not in (None, "") and "got " not in words else ""
    return f"{field_name(path, labels)}: {words}{got}"
