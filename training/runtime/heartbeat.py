"""--heartbeat_dir DIR: each rank keeps DIR/rank-<RANK>.json up to date, so that a monitor can tell a hung rank from
a slow one and name the phase it is stuck in.

A daemon thread rewrites the file every --heartbeat_interval seconds (a temporary file in DIR, then os.replace:
a reader never sees half a file). The step loop only assigns attributes (the phase it enters, the steps done), so
the heartbeat costs the loop nothing. Two clocks in the file tell the faults apart:

- `time` is when the thread last wrote. The thread keeps writing whatever the main thread does, so a rank stuck in
  a collective, a data read or a checkpoint has a fresh `time` and an ageing `phase_since`.
- A rank that is stopped as a whole (SIGSTOP, a frozen node, a process swapped out) stops writing: its `time`
  ages with its `phase_since`.

Fields: rank, local_rank, node_rank (torchrun's GROUP_RANK), world_size, pid, host, step (optimizer steps done),
phase (one of PHASES), phase_since (time.time() when it began), time (time.time() of this write), and compute_s,
wait_s, step_time: this rank's seconds per step over the last logged window (training.runtime.step_timing), null until
the first. The phase is the host's: on CUDA the host runs ahead of the GPU, so a rank whose GPU hangs shows the phase
where its host next waits for the GPU (usually reading a step's loss back).

Writing never fails the run: the first error (a full disk, a removed directory) is logged once and the heartbeat
stops. Standard library only, so it starts before torch is imported.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

from training.flags import SaveFlags

log = logging.getLogger("training")

# start: set-up until the loop; data: waiting for / building the next batch or packed step; collective: the step's
# explicit collectives (token counts, the loss all-reduce, the logging gather); done: after the end of the run.
PHASES = ("start", "data", "forward", "backward", "optimizer", "collective", "eval", "checkpoint", "done")


class Heartbeat:
    def __init__(self, directory: str, interval: float, rank: int, local_rank: int, node_rank: int,
                 world_size: int, tick=None):
        self.path = os.path.join(directory, f"rank-{rank}.json")
        self._tmp = os.path.join(directory, f".rank-{rank}.json.tmp")
        self.interval = interval
        self.ident = {"rank": rank, "local_rank": local_rank, "node_rank": node_rank, "world_size": world_size,
                      "pid": os.getpid(), "host": socket.gethostname()}
        self.step = 0
        self._phase = ("start", time.time())  # one tuple, so the thread never reads a phase with another's start
        self._figures = (None, None, None)  # compute_s, wait_s, step_time
        self._tick = tick  # called by the thread after each write (training.runtime.stacks: copies new stack dumps)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._broken = False

    # ---------------------------------------------------------------- what the loop sets
    def phase(self, name: str) -> tuple[str, float]:
        """Enters phase `name`; returns the phase it left (for restore())."""
        prev, self._phase = self._phase, (name, time.time())
        return prev

    def restore(self, prev: tuple[str, float]) -> None:
        self._phase = prev

    def figures(self, compute_s: float, wait_s: float, step_time: float) -> None:
        self._figures = (compute_s, wait_s, step_time)

    # ---------------------------------------------------------------- the thread
    def start(self) -> "Heartbeat":
        self._write()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()
        return self

    def done(self) -> None:
        """The run is over: phase done, one last write, the thread stops."""
        self.phase("done")
        self.close()

    def close(self) -> None:
        """Stops the thread and writes once more (whatever the phase); idempotent."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=max(5.0, 2 * self.interval))
        self._thread = None
        self._write()

    def snapshot(self) -> dict:
        phase, since = self._phase
        compute_s, wait_s, step_time = self._figures
        return {**self.ident, "step": self.step, "phase": phase, "phase_since": since, "time": time.time(),
                "compute_s": compute_s, "wait_s": wait_s, "step_time": step_time}

    def _run(self) -> None:
        while not self._stop.wait(self.interval) and not self._broken:
            self._write()
            if self._tick is not None and not self._broken:
                try:
                    self._tick()
                except Exception as e:  # a diagnostic aid must never end the heartbeat, let alone the run
                    log.warning("heartbeat: %s", e)
                    self._tick = None

    def _write(self) -> None:
        if self._broken:
            return
        try:
            # 0600, as every file of the run directory it lives in
            fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(self.snapshot()))
            os.replace(self._tmp, self.path)
        except OSError as e:
            self._broken = True
            log.warning("heartbeat: cannot write %s (%s); the heartbeat stops, training goes on", self.path, e)


class NoHeartbeat:
    """Without --heartbeat_dir: the same calls, doing nothing."""
    step = 0

    def phase(self, name: str) -> None:
        return None

    def restore(self, prev) -> None:
        pass

    def figures(self, compute_s: float, wait_s: float, step_time: float) -> None:
        pass

    def done(self) -> None:
        pass

    def close(self) -> None:
        pass


def node_rank() -> int:
    """This node's rank under torchrun (GROUP_RANK), else 0."""
    return int(os.environ.get("GROUP_RANK") or 0)


def from_flags(save: SaveFlags, tick=None) -> Heartbeat | NoHeartbeat:
    """The heartbeat of this process (started), or NoHeartbeat without --heartbeat_dir or when DIR cannot be made
    (said once in the log: the run is worth more than its heartbeat)."""
    if not save.heartbeat_dir:
        return NoHeartbeat()
    try:
        os.makedirs(save.heartbeat_dir, mode=0o700, exist_ok=True)
    except OSError as e:
        log.warning("--heartbeat_dir %s cannot be made (%s): no heartbeat", save.heartbeat_dir, e)
        return NoHeartbeat()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    hb = Heartbeat(save.heartbeat_dir, save.heartbeat_interval, int(os.environ.get("RANK", "0")),
                   int(os.environ.get("LOCAL_RANK", "0")), node_rank(), world, tick=tick)
    return hb.start()
