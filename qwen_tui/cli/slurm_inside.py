"""`qwen-tui replay` of a SLURM preset inside an allocation, drawn with rich: it takes the allocation's nodes and
goes on as over SSH; the batch job of a submitted run takes over the run directory its submission made. (On a
login node the run is submitted and followed instead: cli/slurm_batch.py.)"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.text import Text

from ..nodes.slurm.queries import SlurmError
from ..preset.schema import Preset
from ..run.slurm.allocation import NotInAllocation, allocation_id, on_allocation
from . import styles

__all__ = ["allocation_id", "in_allocation", "take_over_run_dir", "TimeWarning"]


def in_allocation(preset: Preset, job_id: str, console: Console) -> Preset | None:
    """The preset on allocation `job_id`'s nodes, said in one line; None (said why) when it cannot be."""
    try:
        on = on_allocation(preset, job_id)
    except (NotInAllocation, SlurmError) as e:
        console.print(Text(f"not launched: {e}", style=styles.BAD))
        return None
    hosts = [n.host for n in on.cluster.nodes]
    console.print(f"inside SLURM job {job_id}: {len(hosts)} node(s), {', '.join(hosts)}; every check and job step "
                  "runs through srun")
    return on


def take_over_run_dir(preset: Preset, root: Path, run_id: str, console: Console) -> tuple[Preset, bool, int]:
    """The batch job of a submitted run takes over its run directory: (the preset to launch, adopt, attempt).
    After a requeue the directory holds an earlier attempt: this is the next one, and it resumes from the newest
    checkpoint in the output directory (resume_from_checkpoint: auto)."""
    from ..run.rundir import RunDir, RunDirError

    rd = RunDir(root / run_id)
    if not rd.path.is_dir():
        return preset, False, 1
    try:
        state = rd.read_state()
    except RunDirError:
        state = {}
    if not (rd.path / "pids.json").exists():
        return preset, True, 1
    attempt = (state.get("attempt") if type(state.get("attempt")) is int else 1) + 1
    console.print(f"run {run_id} ran before in this job (SLURM requeued it): attempt {attempt} resumes from the "
                  "newest checkpoint in the output directory")
    return preset.with_changes({"training.resume_from_checkpoint": "auto"}), True, attempt


class TimeWarning:
    """SLURM's warning that the job's time is nearly up (sbatch --signal=B:USR1@N reaches the batch shell, which
    is this process): every rank is asked for a checkpoint (run/recovery/checkpoint_request.py), the workers save it and
    stop, and then, if scheduler.requeue allows, the job is requeued; its next run resumes from that checkpoint.
    `launcher()` gives the attempt being followed."""

    SIGNAL = signal.SIGUSR1

    def __init__(self, preset: Preset, launcher: Callable[[], object], console: Console):
        self.preset, self.launcher, self.console = preset, launcher, console
        self.came = threading.Event()
        self._old = None

    def install(self) -> "TimeWarning":
        self._old = signal.signal(self.SIGNAL, self._on_signal)
        return self

    def uninstall(self) -> None:
        if self._old is not None:
            signal.signal(self.SIGNAL, self._old)

    def _on_signal(self, signum, frame) -> None:
        if self.came.is_set():
            return
        self.came.set()
        threading.Thread(target=self._ask, daemon=True, name="time-warning").start()  # not in the handler

    ASK_BOUND_S = 600.0  # a warning that comes while the workers still start is asked again until they run

    def _ask(self) -> None:
        import time

        from ..run.recovery.checkpoint_request import ask_checkpoint

        self.console.print(Text("SLURM: the job's time limit is near (SIGUSR1): asking every rank for a "
                                "checkpoint, then the job is requeued to resume from it", style=styles.WARN_STRONG))
        deadline = time.monotonic() + self.ASK_BOUND_S
        while True:
            la = self.launcher()
            said = ask_checkpoint(la)  # type: ignore[arg-type]
            if all(w.startswith("asked") and not w.startswith("asked 0") for w in said.values()) \
                    or time.monotonic() > deadline or getattr(la, "stop_requested", False):
                break
            time.sleep(2.0)  # the ranks have not started (or written a heartbeat) yet
        for rank, what in sorted(said.items()):
            self.console.print(f"  node {rank}: {what}")

    def after(self, out) -> None:
        """The run ended: requeue the job when the warning came and the workers saved and stopped."""
        from ..nodes.slurm import queries
        from ..run.states import RunState

        if not self.came.is_set():
            return
        job = self.preset.scheduler.job_id
        if out.status != RunState.STOPPED or not job:
            self.console.print(f"SLURM's warning came, but the run ended {out.status}: not requeued")
            return
        if not self.preset.scheduler.requeue:
            self.console.print("checkpoint saved; scheduler.requeue is false: the job ends here (resume it with "
                               "training.resume_from_checkpoint: auto)")
            return
        self.console.print(f"checkpoint saved: requeueing SLURM job {job}; it resumes from it when it runs again")
        try:
            queries.requeue(job)
        except queries.SlurmError as e:
            self.console.print(Text(f"requeue failed: {e}", style=styles.BAD))
