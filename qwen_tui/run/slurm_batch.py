"""A SLURM batch job from a login node: submit it, then follow it through SLURM's states.

PENDING: SLURM's reason (Priority, Resources, QOSMaxGRESPerUser...) and the start its scheduler expects, said
as they change. RUNNING: the nodes SLURM chose; the job's own qwen-tui checks them and starts a step per node,
its lines from the job's output file are shown as they come; once the steps run, this face attaches to them
(through srun, like any view of an allocation) and shows the run as replay does, hangs, stragglers and
relaunches included. A requeue (the time-limit warning, a failed node, preemption) sends it back to PENDING,
and the next run of the job resumes from its last checkpoint. When SLURM ends the job, its final state is the
run's outcome. Ctrl-C cancels the job (scancel): SLURM ends every step on every node.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from rich.console import Console
from rich.text import Text

from ..base.redact import printable
from ..nodes.slurm import queries
from ..nodes.slurm.job_watch import ENDED_WORDS
from ..plan.launch import make_plan
from ..preset.schema import Preset, save_preset
from . import api, styles
from .live import Detached, follow, print_failure
from .rundir import RunDir, new_run_id, write_json_atomic
from .slurm.script import batch_script
from .states import FINAL, RunState

SUBMITTED = "slurm.json"  # in a run directory: the job that runs it (its id, when it was submitted)
SUBMITTED_PRESET = "preset.submitted.yaml"  # the preset as submitted: what the batch script runs
POLL_S = 2.0
START_BOUND_S = 900.0  # from RUNNING until the job's qwen-tui has started the steps (its checks included)


def submitted_job(run_dir: Path) -> Optional[str]:
    """The SLURM job of a submitted run directory, or None (a run qwen-tui launched itself)."""
    try:
        data = json.loads((Path(run_dir) / SUBMITTED).read_text())
    except (OSError, ValueError):
        return None
    job = data.get("job_id") if isinstance(data, dict) else None
    return str(job) if job else None


def test_only(script: str) -> Optional[str]:
    """What `sbatch --test-only` says is wrong with the script's request (None when SLURM would take it)."""
    import subprocess

    try:
        p = subprocess.run(["sbatch", "--test-only"], input=script.encode(), capture_output=True,
                           timeout=queries.BOUND_S)
    except FileNotFoundError:
        return ("sbatch is not installed here: submit from a login node of the cluster (SLURM's client commands "
                "and its configuration)")
    except subprocess.TimeoutExpired:
        return f"sbatch --test-only: no answer from SLURM's controller within {queries.BOUND_S:g}s"
    if p.returncode != 0:
        return (p.stderr.decode(errors="replace").strip() or p.stdout.decode(errors="replace").strip())[-600:]
    return None


def submit(preset: Preset, preset_path: str, *, root: Path, replay_flags: Sequence[str],
           console: Console) -> Optional[tuple[RunDir, str]]:
    """Check the request with SLURM, make the run directory and submit; (run directory, job id), or None (said
    why). The run directory holds the preset the job reads, the script, a plan of stand-in nodes (until the job's
    qwen-tui writes the real one) and the job id."""
    run_id = new_run_id(preset.name or Path(preset_path).stem)
    run_dir = Path(root) / run_id
    script = batch_script(preset, run_dir=str(run_dir), runs_root=str(root), run_id=run_id,
                          preset_file=str(run_dir / SUBMITTED_PRESET), replay_flags=replay_flags)
    refused = test_only(script)
    if refused is not None:
        console.print(Text(f"not submitted: SLURM refuses the request: {printable(refused)}", style=styles.BAD))
        console.print(Text("fix: correct the scheduler section (partition, account, qos, time, nodes, "
                           "gpus_per_node, cpus_per_node) to what the cluster offers (sinfo; sacctmgr show assoc)",
                           style=styles.WARN))
        return None
    rd = RunDir.create(root, run_id)
    # what every run of the job reads (a requeued job picks its nodes anew), and the run's preset until the job's
    # qwen-tui writes the one of the nodes it got; both may hold secrets (network.env)
    save_preset(preset, rd.path / SUBMITTED_PRESET, mode=0o600)
    save_preset(preset, rd.path / "preset.yaml", mode=0o600)
    (rd.path / "job.sbatch").write_text(script)
    rd.write_plan(make_plan(preset, run_id=run_id, local_run_dir=str(rd.path), base_dir=preset.scheduler.workdir))
    try:
        job = queries.submit(script)
    except queries.SlurmError as e:
        rd.write_state(status=RunState.FAILED, message=f"sbatch failed: {e}")
        console.print(Text(f"not submitted: {printable(str(e))}", style=styles.BAD))
        return None
    write_json_atomic(rd.path / SUBMITTED, {"job_id": job, "submitted": time.time()})
    rd.write_state(status=RunState.PENDING, run_id=run_id, slurm={"job_id": job, "state": "PENDING"})
    console.print(f"submitted SLURM job {job}: {preset.scheduler.nodes} node(s); run directory {rd.path}")
    return rd, job


def submit_and_follow(preset: Preset, preset_path: str, *, root: Path, dry_run: bool, console: Console,
                      replay_flags: Sequence[str] = ()) -> int:
    """`qwen-tui replay` of a SLURM preset on a login node: submit it (--dry-run: print the batch script) and
    follow the job; `replay_flags` reach the job's own replay."""
    if dry_run:
        run_id = new_run_id(preset.name or Path(preset_path).stem)
        # the script as it is, never wrapped to the terminal: it is to be read or copied
        sys.stdout.write(batch_script(preset, run_dir=str(Path(root) / run_id), runs_root=str(root), run_id=run_id,
                                      preset_file=str(Path(root) / run_id / SUBMITTED_PRESET),
                                      replay_flags=replay_flags))
        return 0
    got = submit(preset, preset_path, root=root, replay_flags=replay_flags, console=console)
    if got is None:
        return 1
    rd, job = got
    return follow_job(rd, job, console, ctrl_c="stop")


def attach_submitted(run_dir: Path, *, stop: bool) -> int:
    """`qwen-tui attach` of a submitted run: follow its job (Ctrl-C detaches), or with `stop` cancel it."""
    console = Console()
    rd, job = RunDir(Path(run_dir)), submitted_job(Path(run_dir))
    assert job is not None  # the caller asked submitted_job first
    if stop:
        info = queries.job(job)
        if info is None or info.ended:
            console.print(f"SLURM job {job} already ended ({info.state if info else 'forgotten'}); nothing to stop")
            return 0
        return _cancelled(rd, job, console, "stop")
    return follow_job(rd, job, console, ctrl_c="detach")


class _Cancel:
    """Ctrl-C / SIGTERM while following: "stop" cancels the job (scancel), "detach" leaves it."""

    def __init__(self, how: str):
        self.how, self.hit = how, threading.Event()

    def __enter__(self):
        self._old = {s: signal.signal(s, lambda *_: self.hit.set()) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


def _tail(path: Path, offset: int) -> tuple[list[str], int]:
    """New whole lines of a file from `offset`."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(1 << 20)
    except OSError:
        return [], offset
    cut = data.rfind(b"\n") + 1
    return data[:cut].decode(errors="replace").splitlines(), offset + cut


def follow_job(rd: RunDir, job: str, console: Console, *, ctrl_c: str = "detach") -> int:
    """Follow SLURM job `job` of run directory `rd` until SLURM ends it (or Ctrl-C: `ctrl_c` "stop" cancels it,
    "detach" leaves it); the run's exit code."""
    said = ""
    out_file_offset = 0
    followed_attempt = 0
    with _Cancel(ctrl_c) as cancel:
        while True:
            if cancel.hit.is_set():
                return _cancelled(rd, job, console, cancel.how)
            try:
                info = queries.job(job)
            except queries.SlurmError as e:
                console.print(Text(f"asking SLURM about job {job}: {printable(str(e))}", style=styles.WARN))
                cancel.hit.wait(POLL_S * 2)
                continue
            if info is None or info.ended:
                lines, out_file_offset = _tail(rd.path / f"slurm-{job}.out", out_file_offset)
                for ln in lines:  # the job's last words: why it ended, when it says so itself
                    console.print(Text("  job: " + printable(ln), style="dim"))
                return _ended(rd, job, info, console)
            line = _state_line(info)
            if line != said:
                console.print(line, markup=False, highlight=False)
                rd.write_state(slurm={"job_id": job, "state": info.state, "reason": info.why_pending,
                                      "nodes": info.nodes})
                if info.state == "PENDING":
                    rd.write_state(status=RunState.PENDING)
                said = line
            lines, out_file_offset = _tail(rd.path / f"slurm-{job}.out", out_file_offset)
            for ln in lines:
                console.print(Text("  job: " + printable(ln), style="dim"))
            if info.state == "RUNNING":
                state = rd.read_state()
                attempt = state.get("attempt") if type(state.get("attempt")) is int else 0
                if state.get("status") == RunState.RUNNING and attempt > followed_attempt \
                        and (rd.path / "pids.json").exists():
                    followed_attempt = attempt
                    code = _follow_steps(rd, console, ctrl_c)
                    if code is not None:
                        return code
                    # what the job printed meanwhile is what this view showed: read on from its end
                    out_file_offset = _size(rd.path / f"slurm-{job}.out")
                    continue
            cancel.hit.wait(POLL_S)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _state_line(info: queries.JobInfo) -> str:
    if info.state == "PENDING":
        start = queries.expected_start(info.job_id)
        return (f"job {info.job_id} PENDING ({info.why_pending or 'no reason given'})"
                + (f"; SLURM expects it to start {start}" if start else ""))
    if info.state == "RUNNING":
        return (f"job {info.job_id} RUNNING on {len(info.nodes)} node(s): {', '.join(info.nodes)}"
                + (f" (restart {info.restarts})" if info.restarts else ""))
    return f"job {info.job_id} {info.state}" + (f" ({info.why_pending})" if info.why_pending else "")


def _follow_steps(rd: RunDir, console: Console, ctrl_c: str) -> Optional[int]:
    """Attach to the steps the job's qwen-tui started and follow them (live.follow); the exit code once the run
    ended, None when SLURM requeued the job or the attempt ended without ending the run."""
    conns = api.Connections()
    try:
        for ev in api.attach(rd.path, conns):
            if isinstance(ev, api.AlreadyEnded):
                return None
            if isinstance(ev, api.Failure):
                print_failure(ev, console)
                return None
            if isinstance(ev, api.Started):
                la = ev.launcher
                try:
                    out = follow(la, console, ctrl_c="stop" if ctrl_c == "stop" else "detach")
                except Detached:
                    return 0
                if out.status == RunState.RESTARTING:
                    return None
                if out.status == RunState.STOPPED and la.stop_requested:
                    return out.exit_code
                return None  # SLURM says how the job ends: the loop asks it
        return None
    finally:
        conns.close()


def _cancelled(rd: RunDir, job: str, console: Console, how: str) -> int:
    if how == "detach":
        console.print(f"detached from SLURM job {job}; it goes on. qwen-tui attach {rd.path} follows it again")
        return 0
    console.print(Text(f"Ctrl-C: cancelling SLURM job {job} (scancel): SLURM ends every step on every node",
                       style=styles.WARN_STRONG))
    rd.write_state(stop_requested=time.time())
    try:
        queries.cancel(job)
    except queries.SlurmError as e:
        console.print(Text(f"scancel failed: {printable(str(e))}", style=styles.BAD))
        return 1
    deadline = time.monotonic() + 120
    info = None
    while time.monotonic() < deadline:
        info = queries.job(job)
        if info is None or info.ended:
            break
        time.sleep(0.5)
    return _ended(rd, job, info, console)


def _job_said(path: Path) -> str:
    """The job output's line that says why it did not launch ("not launched: ...", "error: ..."), if any."""
    try:
        lines = path.read_text(errors="replace").splitlines()[-200:]
    except OSError:
        return ""
    for ln in reversed(lines):
        s = ln.strip()
        if s.startswith(("not launched:", "not submitted:", "error:", "qwen-tui:")):
            return printable(s)[:300]
    return ""


def _ended(rd: RunDir, job: str, info: Optional[queries.JobInfo], console: Console) -> int:
    """SLURM's last word on the job, recorded beside the run's own, and the exit code it means."""
    state = rd.read_state()
    own = state.get("status")
    slurm_state = info.state if info is not None else "UNKNOWN"
    why = ENDED_WORDS.get(slurm_state, slurm_state.lower())
    if slurm_state == "COMPLETED" and own == RunState.OK:
        status = RunState.OK
        msg = f"SLURM's record: job {job} COMPLETED; training finished on every node"
    elif slurm_state == "CANCELLED" or (slurm_state == "COMPLETED" and own == RunState.STOPPED):
        status = RunState.STOPPED
        msg = f"SLURM: job {job} {slurm_state}: {why}"
    else:
        status = RunState.FAILED
        msg = f"SLURM: job {job} {slurm_state}: {why}"
        if own in FINAL and state.get("message"):
            msg += f"; the run says: {str(state['message']).splitlines()[0]}"
        elif (said := _job_said(rd.path / f"slurm-{job}.out")):
            msg += f"; the job says: {said}"
    if info is not None and info.exit_code not in ("", "0:0"):
        msg += f" (exit code {info.exit_code})"
    rd.write_state(status=status, message=msg, ended=time.time(),
                   slurm={"job_id": job, "state": slurm_state, "exit_code": info.exit_code if info else "",
                          "nodes": info.nodes if info else []})
    console.print(Text(msg, style=styles.outcome_style(status)))
    return status.exit_code
