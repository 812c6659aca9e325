"""The preset's `scheduler` section: who gives the run its nodes.

`kind: ssh` (the default) is the nodes the preset lists, reached over SSH. `kind: slurm` takes them from SLURM:
inside an allocation (`salloc`, or the batch script qwen-tui submits) the nodes are the allocation's, and every
check and job step runs through `srun`; from a login node qwen-tui submits the batch script with these settings
and follows the job. The names are sbatch's own (`partition`, `account`, `qos`, `time`, `constraint`, ...), so a
user of sbatch reads them as the options they are.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
# days-hours:minutes:seconds
_TIME = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# What qwen-tui itself sets in the batch script: an extra_sbatch entry may not set it again differently.
OWNED_OPTIONS = ("--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "--job-name", "-J", "--output", "-o",
                 "--error", "-e", "--signal", "--chdir", "-D", "--partition", "-p", "--account", "-A",
                 "--qos", "-q", "--time", "-t", "--gpus-per-node", "--constraint", "-C", "--exclude", "-x",
                 "--nodelist", "-w", "--requeue", "--no-requeue", "--no-kill", "-k", "--open-mode", "--wrap",
                 "--parsable")


def time_seconds(spec: str) -> int:
    """sbatch's --time as seconds ("UNLIMITED"/"INFINITE": 0, no limit). Raises ValueError for another form."""
    s = spec.strip()
    if s.upper() in ("UNLIMITED", "INFINITE"):
        return 0
    m = _TIME.match(s)
    if not m:
        raise ValueError(f"{spec!r} is not a SLURM time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)")
    d, h, dm, ds, mins, secs, hsecs = m.groups()
    if d is not None:
        return int(d) * 86400 + int(h) * 3600 + int(dm or 0) * 60 + int(ds or 0)
    if hsecs is not None:  # HH:MM:SS
        return int(mins) * 3600 + int(secs) * 60 + int(hsecs)
    return int(mins) * 60 + int(secs or 0)


class Scheduler(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    kind: Literal["ssh", "slurm"] = Field(
        default="ssh", description="ssh: the nodes listed under cluster.nodes, over SSH; slurm: the nodes SLURM "
        "gives (inside an allocation, or a batch job qwen-tui submits and follows)")
    nodes: int = Field(default=2, ge=1, le=4096, description="nodes to ask SLURM for (sbatch --nodes)")
    gpus_per_node: int = Field(default=1, ge=1, le=64, description="processes (GPUs) on every node (sbatch "
                               "--gpus-per-node; on a CPU run, processes only)")
    partition: str | None = Field(default=None, description="sbatch --partition; default the cluster's")
    account: str | None = Field(default=None, description="sbatch --account")
    qos: str | None = Field(default=None, description="sbatch --qos")
    time: str | None = Field(default=None, description="the job's time limit, as sbatch --time takes it "
                                "(e.g. 04:00:00 or 1-12:00:00); default the partition's")
    constraint: str | None = Field(default=None, description="sbatch --constraint (node features)")
    reservation: str | None = Field(default=None, description="sbatch --reservation")
    cpus_per_node: int | None = Field(default=None, ge=1, le=4096,
                                         description="CPUs for the training step on each node (sbatch "
                                         "--cpus-per-task); default 8 per GPU, at least 4")
    exclude: list[str] = Field(default_factory=list, description="nodes SLURM must not give (sbatch --exclude)")
    nodelist: list[str] = Field(default_factory=list, description="nodes SLURM must give (sbatch --nodelist)")
    warn_before_end: int = Field(default=180, ge=0, le=86400,
                                 description="seconds before the time limit at which SLURM warns the job "
                                 "(sbatch --signal=B:USR1@N): the workers save a checkpoint and the job is "
                                 "requeued to resume from it; 0: no warning")
    requeue: bool = Field(default=True, description="a job ended by the time limit warning, a node failure or "
                          "preemption is requeued and resumes from its last checkpoint (sbatch --requeue)")
    extra_sbatch: list[str] = Field(default_factory=list, description="more sbatch options, each '--name' or "
                                    "'--name=value' (e.g. --mail-type=END)")
    workdir: str = Field(default=".", min_length=1, description="where the job runs and keeps its run "
                         "directory: storage the login node and every node see")
    python: str = Field(default="python3", min_length=1, description="the Python on the nodes that has qwen-tui "
                        "and the worker's packages (a venv on shared storage, say)")
    job_id: str | None = Field(default=None, description="the allocation a run was started in (set by "
                                  "qwen-tui in the run's own copy of the preset)")

    @field_validator("partition", "account", "qos", "constraint", "reservation", "workdir", "python", "job_id")
    @classmethod
    def _one_line(cls, v: str | None) -> str | None:
        if v is not None and _CONTROL.search(v):
            raise ValueError("must not contain control characters")
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None:
            time_seconds(v)
        return v

    @field_validator("exclude", "nodelist")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        for h in v:
            if not h or _CONTROL.search(h) or " " in h:
                raise ValueError(f"{h!r} is not a node name (one name or SLURM host list a line, no spaces)")
        return v

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"\d+(_\d+)?", v):
            raise ValueError(f"{v!r} is not a SLURM job id")
        return v

    @field_validator("extra_sbatch")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for opt in v:
            if _CONTROL.search(opt) or not opt.startswith("--") or len(opt) < 3:
                raise ValueError(f"{opt!r}: give each option as '--name' or '--name=value'")
            name = opt.split("=", 1)[0]
            if name in OWNED_OPTIONS:
                raise ValueError(f"{opt!r}: qwen-tui sets {name} itself (from the fields of scheduler and "
                                 "training); set it there")
        return v

    @property
    def is_slurm(self) -> bool:
        return self.kind == "slurm"

    @property
    def time_limit_s(self) -> int:
        """The time limit in seconds; 0 when none is set here (the partition's applies)."""
        return time_seconds(self.time) if self.time else 0
