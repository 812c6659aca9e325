"""`qwen-tui replay` and `attach` of a SLURM batch job from a login node, drawn with rich: what run/slurm/job.py
yields, printed. PENDING and its reason as they change, the job's own lines while it checks its nodes, then the
live view of its steps (as any run), and SLURM's final state. Ctrl-C cancels the job (scancel) for the face that
submitted it; an attach detaches."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from ..base.redact import printable
from ..preset.schema import Preset
from ..run import api
from ..run.rundir import RunDir, new_run_id
from ..run.slurm import job as slurm_job
from ..run.slurm.job import submitted_job
from . import styles
from .live import Detached, follow, print_failure

__all__ = ["submit_and_follow", "attach_submitted", "submitted_job"]


def submit_and_follow(preset: Preset, preset_path: str, *, root: Path, dry_run: bool, console: Console,
                      replay_flags: Sequence[str] = ()) -> int:
    """`qwen-tui replay` of a SLURM preset on a login node: submit it (--dry-run: print the batch script) and
    follow the job; `replay_flags` reach the job's own replay."""
    if dry_run:  # the script as it is, never wrapped to the terminal: it is to be read or copied
        sys.stdout.write(slurm_job.script_for(preset, root, new_run_id(preset.name or Path(preset_path).stem),
                                              replay_flags))
        return 0
    got = None
    for ev in slurm_job.submit(preset, Path(preset_path).stem, root=root, replay_flags=replay_flags):
        if isinstance(ev, api.Failure):
            print_failure(ev, console)
            return 1
        if isinstance(ev, slurm_job.Submitted):
            got = ev
            console.print(f"submitted SLURM job {ev.job_id}: {preset.scheduler.nodes} node(s); run directory "
                          f"{ev.run_dir}", markup=False, highlight=False)
        elif isinstance(ev, api.Stage):
            console.print(Text(ev.text, style="dim"))
    assert got is not None  # submit() ends with Submitted or a Failure
    return follow_submitted(RunDir(got.run_dir), got.job_id, console, ctrl_c="stop")


def attach_submitted(run_dir: Path, *, stop: bool) -> int:
    """`qwen-tui attach` of a submitted run: follow its job (Ctrl-C detaches), or with `stop` cancel it."""
    console = Console()
    rd, job = RunDir(Path(run_dir)), submitted_job(Path(run_dir))
    assert job is not None  # the caller asked submitted_job first
    if stop:
        return _print_all(slurm_job.cancel_and_wait(rd, job), console)
    return follow_submitted(rd, job, console, ctrl_c="detach")


def follow_submitted(rd: RunDir, job: str, console: Console, *, ctrl_c: str) -> int:
    """Follow SLURM job `job` of run directory `rd` to its end; `ctrl_c` "stop" cancels it, "detach" leaves it."""
    stop, detach = threading.Event(), threading.Event()

    def on_signal(signum, frame) -> None:
        (stop if ctrl_c == "stop" and signum != signal.SIGQUIT else detach).set()

    conns = api.Connections()
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)}
    try:
        for ev in slurm_job.follow_job(rd, job, cancelled=detach.is_set, stop_wanted=stop.is_set, conns=conns):
            if isinstance(ev, slurm_job.Queued):
                console.print(ev.text, markup=False, highlight=False)
            elif isinstance(ev, slurm_job.JobOutput):
                for ln in ev.lines:
                    console.print(Text("  job: " + printable(ln), style="dim"))
            elif isinstance(ev, api.Stage) and ev.name in ("slurm", "stop"):
                console.print(Text(ev.text, style=styles.WARN))
            elif isinstance(ev, api.Failure):
                print_failure(ev, console)
            elif isinstance(ev, api.Started):
                try:
                    # the face's own handlers while it follows the steps (Ctrl-C: the launcher cancels the job)
                    follow(ev.launcher, console, ctrl_c="stop" if ctrl_c == "stop" else "detach")
                except Detached:
                    return 0
            elif isinstance(ev, slurm_job.JobEnded):
                console.print(Text(ev.message, style=styles.outcome_style(ev.status)))
                return ev.status.exit_code
        console.print(f"detached from SLURM job {job}; it goes on. qwen-tui attach {rd.path} follows it again")
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        conns.close()


def _print_all(events, console: Console) -> int:
    for ev in events:
        if isinstance(ev, api.Stage):
            console.print(Text(ev.text, style=styles.WARN))
        elif isinstance(ev, api.Failure):
            print_failure(ev, console)
            return 1
        elif isinstance(ev, slurm_job.JobEnded):
            console.print(Text(ev.message, style=styles.outcome_style(ev.status)))
            return 0
    return 1
