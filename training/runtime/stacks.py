"""`kill -USR1 PID`: every thread's Python stack, where a hung rank waits, and the run carries on.

faulthandler's own signal handler writes the dump (C code, no GIL, no Python handler), so it answers even while
the main thread is stuck inside a collective. It writes to one file descriptor per signal:

- without --heartbeat_dir: the process's stderr (the worker's log), as it always did;
- with --heartbeat_dir DIR: DIR/stack-rank-<RANK>.txt, opened once at start and appended to. The file opens with
  a line naming the rank, pid and host. faulthandler cannot write a line of our own around its dump, so the
  heartbeat thread does it once it sees the file grow: it appends a line closing the dump with its time
  ("=== end of stacks: rank R pid P at TIME") and copies the dump to stderr, so the log shows it as before. Those
  two need the GIL; a rank whose main thread holds it forever still gets the dump in the file, only not the
  closing line or the copy.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import sys
import time

log = logging.getLogger("training")


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class StackFile:
    """DIR/stack-rank-<rank>.txt registered for SIGUSR1; check() (the heartbeat's tick) closes each new dump."""

    def __init__(self, directory: str, rank: int):
        self.rank, self.pid = rank, os.getpid()
        self.path = os.path.join(directory, f"stack-rank-{rank}.txt")
        # Unbuffered and appending: faulthandler writes straight to the descriptor, and so do our own lines.
        self._f = os.fdopen(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab", buffering=0)
        self._write(f"=== stacks of rank {rank} (pid {self.pid}, host {socket.gethostname()}) on SIGUSR1 from "
                    f"{_stamp()}; each dump ends with a line giving its time\n")
        self._seen = os.fstat(self._f.fileno()).st_size
        faulthandler.register(signal.SIGUSR1, file=self._f, all_threads=True)

    def _write(self, text: str) -> None:
        self._f.write(text.encode())

    def check(self) -> None:
        """Closes a dump that appeared since the last check (after it stopped growing) and copies it to stderr."""
        size = os.fstat(self._f.fileno()).st_size
        if size <= self._seen:
            return
        deadline = time.monotonic() + 1.0  # the handler writes a dump in well under a millisecond
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = os.fstat(self._f.fileno()).st_size
            if now == size:
                break
            size = now
        with open(self.path, "rb") as f:
            f.seek(self._seen)
            dump = f.read(size - self._seen)
        self._write(f"=== end of stacks: rank {self.rank} pid {self.pid} at {_stamp()}\n")
        self._seen = os.fstat(self._f.fileno()).st_size
        if sys.__stderr__ is not None:
            sys.__stderr__.write(f"[rank {self.rank}] stacks on SIGUSR1 (also in {self.path}):\n"
                                 + dump.decode(errors="replace"))
            sys.__stderr__.flush()


def register(heartbeat_dir: str | None, rank: int) -> StackFile | None:
    """SIGUSR1 dumps every thread's stack: into DIR/stack-rank-<rank>.txt with a heartbeat directory, else to
    stderr. Returns the StackFile (whose check() the heartbeat calls) or None."""
    if heartbeat_dir:
        try:
            os.makedirs(heartbeat_dir, mode=0o700, exist_ok=True)  # in the run directory: 0700 as it is
            return StackFile(heartbeat_dir, rank)
        except OSError as e:
            log.warning("cannot open a stack file in --heartbeat_dir %s (%s): SIGUSR1 dumps stacks to stderr",
                        heartbeat_dir, e)
    # To the process's own stderr (sys.stderr may be a stand-in without a file descriptor when main() is called
    # in-process).
    if sys.__stderr__ is not None:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    return None
