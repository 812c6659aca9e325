"""What qwen-tui asks SLURM's controller, each a bounded call of SLURM's own commands (scontrol, squeue, sinfo,
sbatch, scancel) on this machine, and each answer parsed into plain data. The words are SLURM's: a job's state is
the JobState scontrol prints (PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, TIMEOUT, NODE_FAIL, PREEMPTED,
OUT_OF_MEMORY, ...), its reason the Reason field (Priority, Resources, QOSMaxGRESPerUser, ...).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

BOUND_S = 20.0  # one call to the controller; a controller that does not answer is an error, not a wait

# JobState values after which the job will not run again (unless it is requeued: it is then PENDING anew)
ENDED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
# the node states that mean the node is gone for the job (sinfo/scontrol spell them with suffixes: DOWN*, DRAIN...)
NODE_GONE = ("DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "POWER_DOWN", "POWERED_DOWN", "REBOOT")

_KV = re.compile(r"(\S+?)=(.*?)(?=\s+\S+?=|\s*$)")


class SlurmError(RuntimeError):
    """A SLURM command failed or could not be run: its own words."""


@dataclass
class JobInfo:
    job_id: str
    state: str  # JobState
    reason: str = ""  # Reason ("None" when there is none)
    nodes: list[str] = field(default_factory=list)  # NodeList expanded, SLURM's order
    nodelist: str = ""  # NodeList as SLURM writes it
    batch_host: str = ""
    restarts: int = 0
    exit_code: str = ""  # "rc:signal"
    time_limit: str = ""
    start_time: str = ""
    name: str = ""
    raw: dict[str, str] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def why_pending(self) -> str:
        return "" if self.reason in ("", "None", "(null)") else self.reason


def slurm(argv: Sequence[str], *, env: Mapping[str, str] | None = None, input: bytes | None = None,
          bound: float = BOUND_S) -> str:
    """Run a SLURM command; its stdout. SlurmError with its stderr when it fails or outlasts `bound`."""
    try:
        p = subprocess.run(list(argv), capture_output=True, timeout=bound, input=input,
                           env=dict(env) if env is not None else None)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed here: qwen-tui runs SLURM's own commands "
                         "(the slurm-client package), on a machine of the cluster") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv[:2])}: no answer from SLURM's controller within {bound:g}s") from None
    if p.returncode != 0:
        said = p.stderr.decode(errors="replace").strip() or p.stdout.decode(errors="replace").strip()
        raise SlurmError(f"{' '.join(argv[:2])} failed (exit {p.returncode}): {said[-500:]}")
    return p.stdout.decode(errors="replace")


def parse_record(line: str) -> dict[str, str]:
    """One `scontrol show ... -o` record as key -> value."""
    return {m.group(1): m.group(2) for m in _KV.finditer(line.strip())}


def hostnames(nodelist: str) -> list[str]:
    """A SLURM host list (node[0-2],gpu7) expanded by SLURM itself, in its order."""
    if not nodelist or nodelist == "(null)":
        return []
    return slurm(["scontrol", "show", "hostnames", nodelist]).split()


def job(job_id: str) -> JobInfo | None:
    """The job as SLURM's controller knows it; None once it has forgotten it (MinJobAge past)."""
    try:
        out = slurm(["scontrol", "show", "job", "-o", str(job_id)])
    except SlurmError as e:
        if "Invalid job id" in str(e):
            return None
        raise
    line = next((ln for ln in out.splitlines() if ln.startswith("JobId=")), "")
    if not line:
        return None
    r = parse_record(line)
    nodelist = r.get("NodeList", "")
    restarts = r.get("Restarts", "0")
    return JobInfo(job_id=r.get("JobId", str(job_id)), state=r.get("JobState", "UNKNOWN"), reason=r.get("Reason", ""),
                   nodes=hostnames(nodelist) if nodelist not in ("", "(null)") else [], nodelist=nodelist,
                   batch_host=r.get("BatchHost", ""), restarts=int(restarts) if restarts.isdigit() else 0,
                   exit_code=r.get("ExitCode", ""), time_limit=r.get("TimeLimit", ""),
                   start_time=r.get("StartTime", ""), name=r.get("JobName", ""), raw=r)


def expected_start(job_id: str) -> str:
    """When SLURM's scheduler expects a pending job to start ("" when it gives no estimate)."""
    try:
        out = slurm(["squeue", "--start", "-h", "-j", str(job_id), "-o", "%S"]).strip()
    except SlurmError:
        return ""
    return "" if out in ("", "N/A", "Unknown") else out


def node_states(hosts: Sequence[str]) -> dict[str, tuple[str, str]]:
    """host -> (state, reason) as SLURM's controller has them (state like IDLE, ALLOCATED, DOWN*, DRAINED)."""
    if not hosts:
        return {}
    out = slurm(["scontrol", "show", "node", "-o", ",".join(hosts)])
    states = {}
    for line in out.splitlines():
        r = parse_record(line)
        if "NodeName" in r:
            states[r["NodeName"]] = (r.get("State", "UNKNOWN"), r.get("Reason", ""))
    return states


def node_gone(state: str) -> bool:
    """Whether a node state (ALLOCATED, DOWN*, IDLE+DRAIN, MIXED+NOT_RESPONDING...) means the node is lost."""
    words = re.split(r"[+]", state.upper().rstrip("*~#!%$@^-"))
    return any(w in NODE_GONE for w in words)


def submit(script: str, *, env: Mapping[str, str] | None = None, extra: Sequence[str] = ()) -> str:
    """sbatch the script (on stdin); the job id."""
    out = slurm(["sbatch", "--parsable", *extra], input=script.encode(), env=env).strip()
    jid = out.split(";", 1)[0]
    if not re.fullmatch(r"\d+(_\d+)?", jid):
        raise SlurmError(f"sbatch printed no job id: {out[-300:]!r}")
    return jid


def cancel(job_id: str, *, signal: str | None = None, batch: bool = False) -> None:
    """scancel the job (or send it `signal`; `batch`: to the batch shell only)."""
    argv = ["scancel"]
    if signal:
        argv += ["--signal", signal]
    if batch:
        argv += ["--batch"]
    slurm([*argv, str(job_id)])


def requeue(job_id: str) -> None:
    slurm(["scontrol", "requeue", str(job_id)])
