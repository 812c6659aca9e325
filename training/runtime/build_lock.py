"""One builder, the others waiting: a lock file shared by the processes of a job (on one node, or on
shared storage across nodes), used where one rank builds something the others then read (the
tokenized cache, a universal checkpoint).

The lock is created with O_EXCL and holds a note saying who built (host, pid, and more). Its holder
touches it every HEARTBEAT_S while it works, so a waiter tells a slow builder from a dead one: a lock
untouched for STALE_S belongs to a builder that died and may be taken over.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

HEARTBEAT_S = 5.0
STALE_S = 60.0  # a lock untouched this long belongs to a builder that died


def take(lock: Path, logger: logging.Logger, takeover: str, **note) -> bool:
    """True if this process now holds `lock` (created, or taken over from a dead holder). A takeover is
    warned on `logger` as "<takeover> LOCK (untouched for N s)"; `note` adds to the host and pid it records."""
    body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), **note}).encode()
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return False  # its holder just finished: look again
        if age < STALE_S:
            return False
        logger.warning("%s %s (untouched for %.0f s)", takeover, lock, age)
        tmp = lock.with_name(f"{lock.name}.{socket.gethostname()}.{os.getpid()}")
        tmp.write_bytes(body)
        os.replace(tmp, lock)
        return True
    with os.fdopen(fd, "wb") as f:
        f.write(body)
    return True


def holder(lock: Path, nobody: str) -> str:
    """Who holds `lock` (host and pid), for a waiter's error; `nobody` when it cannot be read."""
    try:
        d = json.loads(lock.read_text())
        return f"{d.get('host')} pid {d.get('pid')}"
    except (OSError, ValueError):
        return nobody


class Heartbeat:
    """Touches the lock while its holder works (a context manager)."""

    def __init__(self, lock: Path, name: str):
        self.lock, self.stop = lock, threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self):
        while not self.stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.lock)
            except FileNotFoundError:
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
