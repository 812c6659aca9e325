"""A checkpoint asked for from outside, then a quiet stop: SIGUSR2. qwen-tui sends it to every rank when SLURM
warns that the job's time limit is near (sbatch --signal), so that the job can be requeued and resume from it.

The signal only raises a flag. Every rank adds its flag to the all-reduce each step already makes (the step's
loss), so all ranks learn of the request at the same step, whenever the signal reached each of them, and save
the same checkpoint together (training/step_loop.py). Installed first thing: SIGUSR2's default action ends the
process, and a signal during start-up must not kill a rank.
"""

from __future__ import annotations

import signal

SIGNAL = signal.SIGUSR2


class SaveRequest:
    def __init__(self) -> None:
        self.asked = False

    def install(self):
        """Handle SIGUSR2 from now on; returns the previous handler."""
        return signal.signal(SIGNAL, self._handle)

    def _handle(self, signum, frame) -> None:
        self.asked = True


REQUEST = SaveRequest()  # one per process: the signal handler and the step loop share it
