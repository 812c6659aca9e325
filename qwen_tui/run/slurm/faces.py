"""What `qwen-tui replay` does with a SLURM preset, drawn with rich: inside an allocation it takes the allocation's
nodes and goes on as over SSH; on a login node it submits the batch job and follows it (run/slurm/follow.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.text import Text

from ...nodes.slurm.queries import SlurmError
from ...preset.schema import Preset
from .. import styles
from .allocation import NotInAllocation, allocation_id, on_allocation

__all__ = ["allocation_id", "in_allocation", "submit_and_follow"]


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


def submit_and_follow(preset: Preset, preset_path: str, *, root: Path, dry_run: bool, console: Console,
                      overwrite_output: bool) -> int:
    from .follow import submit_and_follow as go

    return go(preset, preset_path, root=root, dry_run=dry_run, console=console, overwrite_output=overwrite_output)
