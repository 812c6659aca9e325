"""Where the worker keeps what it can rebuild (the tiny model, tokenized data): $QWEN_TUI_CACHE, else
$XDG_CACHE_HOME/qwen-tui, else ~/.cache/qwen-tui, as the XDG base directory convention asks."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    if os.environ.get("QWEN_TUI_CACHE"):
        return Path(os.environ["QWEN_TUI_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the spec: a relative value is invalid and is ignored
        return Path(xdg) / "qwen-tui"
    return Path(os.path.expanduser("~")) / ".cache" / "qwen-tui"
