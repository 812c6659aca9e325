"""A SLURM preset inside an allocation: its nodes are the allocation's, in SLURM's order (node 0, the master,
is the first), and every node is reached through srun (nodes/slurm/transport.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ...nodes.slurm import queries
from ...preset.schema import Preset


class NotInAllocation(RuntimeError):
    """The allocation a run needs is not there (no job, or a job that is not running)."""


def allocation_id(env: Mapping[str, str] | None = None) -> str | None:
    """The allocation this process runs in (salloc, srun or a batch job set SLURM_JOB_ID), else None."""
    env = os.environ if env is None else env
    return env.get("SLURM_JOB_ID") or None


def on_allocation(preset: Preset, job_id: str) -> Preset:
    """The preset on the nodes of running job `job_id`. Raises NotInAllocation, or queries.SlurmError when SLURM
    cannot be asked."""
    info = queries.job(job_id)
    if info is None:
        raise NotInAllocation(f"SLURM knows no job {job_id} (SLURM_JOB_ID): run qwen-tui inside a live allocation")
    if info.state != "RUNNING" or not info.nodes:
        raise NotInAllocation(f"SLURM job {job_id} is {info.state}, not running: its nodes cannot be used")
    return preset.on_nodes(info.nodes, job_id)
