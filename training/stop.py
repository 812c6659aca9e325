"""A stop asked for by SIGTERM (qwen-tui's stop-all, a scheduler's preemption): the worker ends
quietly, with one line in its log, instead of a traceback.

The first SIGTERM raises StopRequested wherever the worker is, so it unwinds at once (a rank
blocked in a collective sees the signal as soon as the call returns, usually with an error
because a peer has gone: that error is part of the same stop, not a failure of its own).
Later signals are ignored while it unwinds.

Under torchrun a stopped worker exits 0: the elastic agent treats any other exit code as a
failure and ends with its ChildFailedError traceback, even though the stop was asked for.
The metrics' end record says "stopped", so nobody reads that 0 as a finished training.
Run without torchrun, it exits 128 + the signal, as a process killed by it would.
"""

from __future__ import annotations

import os
import signal
from typing import Optional


class StopRequested(Exception):
    """The worker was asked to stop (SIGTERM)."""


class StopSignal:
    def __init__(self) -> None:
        self.signum: Optional[int] = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self):
        """Handle SIGTERM from now on; returns the previous handler (for restore)."""
        return signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        if self.signum is not None:
            return  # already unwinding: a second signal must not break the clean exit
        self.signum = signum
        raise StopRequested(f"stopped by signal {signal.Signals(signum).name}")

    def exit_code(self) -> int:
        under_torchrun = bool(os.environ.get("TORCHELASTIC_RUN_ID"))
        return 0 if under_torchrun or self.signum is None else 128 + self.signum

    def line(self, step: Optional[int]) -> str:
        where = f"at step {step}" if step is not None else "before training started"
        name = signal.Signals(self.signum).name if self.signum is not None else "a signal"
        return f"stopped by request {where} ({name})"
