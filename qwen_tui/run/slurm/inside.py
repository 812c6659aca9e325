"""`qwen-tui replay` of a SLURM preset inside an allocation, drawn with rich: it takes the allocation's nodes and
goes on as over SSH; the batch job of a submitted run takes over the run directory its submission made. (On a
login node the run is submitted and followed instead: run/slurm_batch.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.text import Text

from ...nodes.slurm.queries import SlurmError
from ...preset.schema import Preset
from .. import styles
from .allocation import NotInAllocation, allocation_id, on_allocation

__all__ = ["allocation_id", "in_allocation", "take_over_run_dir"]


def in_allocation(preset: Preset, job_id: str, console: Console) -> Optional[Preset]:
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
    from ..rundir import RunDir, RunDirError

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
