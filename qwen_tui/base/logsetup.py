"""`-v/--verbose`: Python logging for qwen-tui and the libraries it drives.

-v logs INFO to stderr; -vv logs DEBUG, paramiko's SSH negotiation included (its DEBUG names key
exchange, ciphers and auth methods, never a password). While logging is on, every run directory created
gets a `qwen-tui.log` with the same records (run.rundir calls `log_to_run_dir`), so a run's log survives the
terminal. The wizard logs to that file only: stderr belongs to the screen.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

LOG_FILE = "qwen-tui.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_level: int | None = None


def configure(verbosity: int, *, stderr: bool = True) -> int | None:
    """Turns logging on for verbosity >= 1; returns the level (None when off)."""
    global _level
    if verbosity <= 0:
        return None
    _level = logging.INFO if verbosity == 1 else logging.DEBUG
    root = logging.getLogger()
    root.setLevel(_level)
    if stderr:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(h)
    # paramiko's transport logs every packet type at DEBUG: only when asked for with -vv
    logging.getLogger("paramiko").setLevel(logging.DEBUG if verbosity >= 2 else logging.WARNING)
    return _level


def log_to_run_dir(run_dir: Path) -> Path | None:
    """Adds RUN_DIR/qwen-tui.log to the logging handlers when logging is on."""
    if _level is None:
        return None
    path = Path(run_dir) / LOG_FILE
    # 0600 like the run directory's other files, and never through a link planted in its place
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
    h = logging.FileHandler(path, encoding="utf-8")
    h.setLevel(_level)
    h.setFormatter(logging.Formatter(FORMAT))
    logging.getLogger().addHandler(h)
    logging.getLogger("qwen_tui").info("logging to %s", path)
    return path
