"""A SLURM batch job from a login node, as the launch API's steps: submit it, then follow it through SLURM's states,
as events every face renders (replay's rich view in cli/slurm_batch.py, the wizard's Run screen).

`submit()` checks the request with SLURM (sbatch --test-only), makes the run directory and submits: Submitted, or
a Failure. `follow_job()` then yields Queued whenever SLURM's word on the job changes (PENDING with its reason
and the start its scheduler expects; RUNNING on the nodes it chose), JobOutput with what the batch job prints
(its own qwen-tui checks the nodes and starts a step per node), Started with a launcher attached to those steps
once they run (the face follows it as any run, then goes on with this generator), and last JobEnded with
SLURM's final state as the run's outcome. A requeue (the time-limit warning, a failed node, preemption) goes
back to PENDING, and the job's next run resumes from its last checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...base.redact import printable
from ...nodes.slurm import queries
from ...nodes.slurm.job_watch import ENDED_WORDS
from ...plan.launch import make_plan
from ...preset.files import save_preset
from ...preset.schema import Preset
from .. import api
from ..events import Failure, Stage, Started
from ..export.slurm_preset import batch_script
from ..rundir import RunDir, new_run_id, write_json_atomic
from ..states import FINAL, RunState

SUBMITTED = "slurm.json"  # in a run directory: the job that runs it (its id, when it was submitted)
SUBMITTED_PRESET = "preset.submitted.yaml"  # the preset as submitted: what every run of the batch job reads
POLL_S = 2.0
CANCEL_BOUND_S = 120.0  # scancel until SLURM says the job ended (its KillWait and the steps' own stop inside)


@dataclass(frozen=True)
class Submitted:
    job_id: str
    run_dir: Path


@dataclass(frozen=True)
class Queued:
    """SLURM's word on the job, when it changes: its state, the reason it waits, when its scheduler expects it to
    start, the nodes it runs on, how often it was requeued."""

    job_id: str
    state: str
    reason: str = ""
    expected_start: str = ""
    nodes: tuple[str, ...] = ()
    restarts: int = 0

    @property
    def text(self) -> str:
        if self.state == "PENDING":
            return (f"job {self.job_id} PENDING ({self.reason or 'no reason given'})"
                    + (f"; SLURM expects it to start {self.expected_start}" if self.expected_start else ""))
        if self.state == "RUNNING":
            return (f"job {self.job_id} RUNNING on {len(self.nodes)} node(s): {', '.join(self.nodes)}"
                    + (f" (restart {self.restarts})" if self.restarts else ""))
        return f"job {self.job_id} {self.state}" + (f" ({self.reason})" if self.reason else "")


@dataclass(frozen=True)
class JobOutput:
    """Lines the batch job printed (its qwen-tui's checks and plan), as they come."""

    lines: tuple[str, ...]


@dataclass(frozen=True)
class JobEnded:
    """SLURM ended the job: its final state, and what that makes of the run."""

    job_id: str
    slurm_state: str
    status: RunState
    message: str
    exit_code: str = ""


JobEvent = Stage | Failure | Submitted | Queued | JobOutput | Started | JobEnded


def submitted_job(run_dir: Path) -> str | None:
    """The SLURM job of a submitted run directory, or None (a run qwen-tui launched itself)."""
    try:
        data = json.loads((Path(run_dir) / SUBMITTED).read_text())
    except (OSError, ValueError):
        return None
    job = data.get("job_id") if isinstance(data, dict) else None
    return str(job) if job else None


def script_for(preset: Preset, root: Path, run_id: str, replay_flags: Sequence[str] = ()) -> str:
    """The batch script of run `run_id` under runs root `root` (what submit() submits, what --dry-run prints)."""
    run_dir = Path(root) / run_id
    return batch_script(preset, run_dir=str(run_dir), runs_root=str(root), run_id=run_id,
                        preset_file=str(run_dir / SUBMITTED_PRESET), replay_flags=replay_flags)


def test_only(script: str) -> str | None:
    """What `sbatch --test-only` says is wrong with the script's request (None when SLURM would take it)."""
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


def submit(preset: Preset, name: str, *, root: Path, replay_flags: Sequence[str] = ()) -> Iterator[JobEvent]:
    """Check the request with SLURM, make the run directory and submit: Stage, then Submitted or a Failure. The
    run directory holds the preset the job reads, the script, a plan of stand-in nodes (until the job's qwen-tui
    writes the real one), the job id and the state PENDING."""
    run_id = new_run_id(preset.name or name)
    yield Stage("submit", f"asking SLURM whether it takes {preset.scheduler.nodes} node(s) (sbatch --test-only)…")
    script = script_for(preset, root, run_id, replay_flags)
    refused = test_only(script)
    if refused is not None:
        yield Failure("submit", f"not submitted: SLURM refuses the request: {printable(refused)}",
                      "correct the scheduler section (partition, account, qos, time, nodes, gpus_per_node, "
                      "cpus_per_node) to what the cluster offers (sinfo; sacctmgr show assoc)")
        return
    rd = RunDir.create(root, run_id)
    # what every run of the job reads (a requeued job picks its nodes anew), and the run's preset until the job's
    # qwen-tui writes the one of the nodes it got; both may hold secrets (network.env)
    save_preset(preset, rd.path / SUBMITTED_PRESET, mode=0o600)
    save_preset(preset, rd.path / "preset.yaml", mode=0o600)
    (rd.path / "job.sbatch").write_text(script)
    rd.write_plan(make_plan(preset, run_id=run_id, local_run_dir=str(rd.path), base_dir=preset.scheduler.workdir))
    yield Stage("submit", "submitting the batch job (sbatch)…")
    try:
        job = queries.submit(script)
    except queries.SlurmError as e:
        rd.write_state(status=RunState.FAILED, message=f"sbatch failed: {e}")
        yield Failure("submit", f"not submitted: {printable(str(e))}", "sbatch's own words say why")
        return
    write_json_atomic(rd.path / SUBMITTED, {"job_id": job, "submitted": time.time()})
    rd.write_state(status=RunState.PENDING, run_id=run_id, slurm={"job_id": job, "state": "PENDING"})
    yield Submitted(job, rd.path)


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


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def follow_job(rd: RunDir, job: str, *, cancelled: Callable[[], bool] = lambda: False,
               stop_wanted: Callable[[], bool] = lambda: False, conns: api.Connections | None = None,
               poll: float = POLL_S) -> Iterator[JobEvent]:
    """SLURM's states of job `job` as events until SLURM ends it (the module docstring). `cancelled()` true: return
    (the face is closing; the job goes on). `stop_wanted()` true: cancel the job (scancel) and follow it to its
    end. `conns`: the connections a Started launcher uses (the face closes them)."""
    said: Queued | None = None
    offset = 0
    followed = 0  # the attempt a launcher was handed out for
    out_file = rd.path / f"slurm-{job}.out"
    conns = conns or api.Connections()
    while not cancelled():
        if stop_wanted():
            yield from _cancel(rd, job)
            return
        try:
            info = queries.job(job)
        except queries.SlurmError as e:
            yield Stage("slurm", f"asking SLURM about job {job}: {printable(str(e))}")
            time.sleep(poll * 2)
            continue
        if info is None or info.ended:
            lines, offset = _tail(out_file, offset)
            if lines:  # the job's last words: why it ended, when it says so itself
                yield JobOutput(tuple(lines))
            yield ended(rd, job, info)
            return
        now = Queued(job, info.state, info.why_pending,
                     queries.expected_start(job) if info.state == "PENDING" else "", tuple(info.nodes),
                     info.restarts)
        if now != said:
            rd.write_state(slurm={"job_id": job, "state": info.state, "reason": info.why_pending,
                                  "nodes": info.nodes})
            if info.state == "PENDING":
                rd.write_state(status=RunState.PENDING)
            said = now
            yield now
        lines, offset = _tail(out_file, offset)
        if lines:
            yield JobOutput(tuple(lines))
        if info.state == "RUNNING":
            state = rd.read_state()
            attempt = state.get("attempt") if type(state.get("attempt")) is int else 0
            if state.get("status") == RunState.RUNNING and attempt > followed and (rd.path / "pids.json").exists():
                followed = attempt
                for ev in api.attach(rd.path, conns):
                    yield ev  # Stage, Connected, Failure, AlreadyEnded, or Started: the face follows it, then on
                offset = _size(out_file)  # what the job printed meanwhile is what the face showed
                continue
        time.sleep(poll)


def _cancel(rd: RunDir, job: str) -> Iterator[JobEvent]:
    yield Stage("stop", f"cancelling SLURM job {job} (scancel): SLURM ends every step on every node…")
    rd.write_state(stop_requested=time.time())
    try:
        queries.cancel(job)
    except queries.SlurmError as e:
        yield Failure("stop", f"scancel failed: {printable(str(e))}", "cancel it with scancel yourself")
        return
    deadline = time.monotonic() + CANCEL_BOUND_S
    info = None
    while time.monotonic() < deadline:
        info = queries.job(job)
        if info is None or info.ended:
            break
        time.sleep(0.5)
    yield ended(rd, job, info)


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


def ended(rd: RunDir, job: str, info: queries.JobInfo | None) -> JobEnded:
    """SLURM's last word on the job (None: forgotten), recorded beside the run's own, as the run's outcome."""
    state = rd.read_state()
    own = state.get("status")
    slurm_state = info.state if info is not None else "UNKNOWN"
    why = ENDED_WORDS.get(slurm_state, slurm_state.lower())
    if slurm_state == "COMPLETED" and own == RunState.OK:
        status, msg = RunState.OK, f"SLURM's record: job {job} COMPLETED; training finished on every node"
    elif slurm_state == "CANCELLED" or (slurm_state == "COMPLETED" and own == RunState.STOPPED):
        status, msg = RunState.STOPPED, f"SLURM: job {job} {slurm_state}: {why}"
    else:
        status, msg = RunState.FAILED, f"SLURM: job {job} {slurm_state}: {why}"
        if own in FINAL and state.get("message"):
            msg += f"; the run says: {str(state['message']).splitlines()[0]}"
        elif (said := _job_said(rd.path / f"slurm-{job}.out")):
            msg += f"; the job says: {said}"
    code = info.exit_code if info is not None else ""
    if code not in ("", "0:0"):
        msg += f" (exit code {code})"
    rd.write_state(status=status, message=msg, ended=time.time(),
                   slurm={"job_id": job, "state": slurm_state, "exit_code": code,
                          "nodes": info.nodes if info else []})
    return JobEnded(job, slurm_state, status, msg, code)


def cancel_and_wait(rd: RunDir, job: str) -> Iterator[JobEvent]:
    """`attach --stop` of a submitted run: cancel its job and say how it ended."""
    info = queries.job(job)
    if info is None or info.ended:
        yield ended(rd, job, info)
        return
    yield from _cancel(rd, job)
