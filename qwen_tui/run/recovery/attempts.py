"""What a relaunch after a failure changes, as plain data: which nodes go, how the
global batch is kept on the nodes left, which checkpoint every node can resume from,
whether a failure is worth another attempt (how attempts read in state.json is run/runs.py's).
Pure: no I/O. The driver that uses them is run/recovery/restarts.py.

The global batch must not change across a resume: the worker refuses a checkpoint
trained with another one, because the data order (global batches cut from one
seeded permutation, training/data/batches.py) and the step count depend on it. So with
fewer GPUs the per-device batch and the accumulation are re-split; when the global
batch is not a multiple of the new world size it cannot be kept, and the relaunch
is refused with the numbers rather than silently training something else.

A ZeRO checkpoint resumes on fewer processes through DeepSpeed's universal format (the
worker converts it, training/checkpoints/universal.py), when every rank's slice of it can be read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ...preset.schema import Preset
from ..states import RunState

MAX_ACCUMULATION = 4096  # the preset's bound on gradient_accumulation_steps
CKPT_NAME = re.compile(r"^checkpoint-(\d+)$")
# Causes that fail every attempt the same way: a relaunch would only repeat them.
# TRAINING_ERROR: every node exited 0 but the worker's end record says it failed (run/launcher.py).
# HANG_STOPPED: the preset asked a hang to stop the run (monitor.on_hang: stop), not to relaunch it
NOT_TRANSIENT = {"MODULE_MISSING", "NO_SUCH_INTERFACE", "DISK_FULL", "CUDA_OOM", "ADDR_IN_USE", "TRAINING_ERROR",
                 "HANG_STOPPED"}


class RestartRefused(ValueError):
    """A relaunch that cannot be made as asked; the message says why and what to change."""


@dataclass(frozen=True)
class BatchFit:
    """How the global batch is split over `world_size` processes."""

    world_size: int
    per_device: int
    accumulation: int

    @property
    def global_batch(self) -> int:
        return self.world_size * self.per_device * self.accumulation

    def describe(self) -> str:
        return (f"{self.per_device} per device x {self.accumulation} accumulation x {self.world_size} GPUs "
                f"= {self.global_batch}")


def refit_batch(global_batch: int, per_device: int, world_size: int) -> BatchFit:
    """The split of `global_batch` over `world_size` processes that keeps it exactly, with the largest
    per-device batch not above `per_device` (memory was sized for that) and so the least accumulation.
    Raises RestartRefused, with the nearest global batches that would fit, when none keeps it."""
    if world_size < 1 or per_device < 1 or global_batch < 1:
        raise ValueError(f"sizes must be positive: global {global_batch}, per device {per_device}, "
                         f"world {world_size}")
    if global_batch % world_size:
        lo, hi = (global_batch // world_size) * world_size, -(-global_batch // world_size) * world_size
        near = " or ".join(str(b) for b in (lo, hi) if b > 0)
        raise RestartRefused(f"the global batch of {global_batch} cannot be kept exactly on {world_size} GPUs "
                             f"({global_batch} is not a multiple of {world_size}; the nearest that fit are {near}), "
                             "and a checkpoint resumes only with the global batch it was trained with")
    per_process = global_batch // world_size
    micro = max(d for d in range(1, min(per_device, per_process) + 1) if per_process % d == 0)
    fit = BatchFit(world_size, micro, per_process // micro)
    if fit.accumulation > MAX_ACCUMULATION:
        raise RestartRefused(f"keeping the global batch of {global_batch} on {world_size} GPUs needs "
                             f"{fit.accumulation} accumulation steps, above the limit of {MAX_ACCUMULATION}")
    return fit


def without_nodes(preset: Preset, gone: Iterable[int], *, resuming: bool) -> tuple[Preset, BatchFit]:
    """The preset of a relaunch without the nodes `gone` (indexes into preset.cluster.nodes): the same
    training with the batch re-split so that the global batch stays. Raises RestartRefused."""
    gone = set(gone)
    nodes = preset.cluster.nodes
    left = [n for i, n in enumerate(nodes) if i not in gone]
    if not left:
        raise RestartRefused("no node is left to relaunch on")
    t = preset.training
    if 0 in gone and preset.network.master_addr:
        raise RestartRefused(f"the failed node 0 ({nodes[0].label}) is the master and network.master_addr "
                             f"({preset.network.master_addr}) fixes its address; leave network.master_addr empty "
                             f"so that the next node ({left[0].label}) can take over as the master")
    world = sum(n.gpus for n in left)
    if resuming and t.zero_stage is not None and world != preset.world_size:
        why = zero_resume_blocker(preset)
        if why:
            raise RestartRefused(f"DeepSpeed ZeRO-{t.zero_stage} optimizer state saved by {preset.world_size} "
                                 f"processes cannot be resumed on {world} here: {why}; relaunch on the same nodes "
                                 "(without --exclude-failed)")
    fit = refit_batch(preset.effective_batch_size, t.per_device_train_batch_size, world)
    new = preset.model_copy(deep=True)
    new.cluster.nodes = [n.model_copy(deep=True) for n in left]
    new.training.per_device_train_batch_size = fit.per_device
    new.training.gradient_accumulation_steps = fit.accumulation
    return new, fit


def zero_resume_blocker(preset: Preset) -> str | None:
    """Why a ZeRO checkpoint of this preset cannot resume on another number of processes (None: it can).

    The worker converts it to DeepSpeed's universal format (training/checkpoints/universal.py), which needs every rank's
    optimizer slice in one directory: with a copy of the checkpoints on each node, the lost node's slices
    are gone with it. Offloaded and 4-bit (Q-LoRA) optimizer states were not tried, so they are not claimed."""
    t, nodes = preset.training, preset.cluster.nodes
    if not (preset.cluster.shared_storage or all(n.is_local for n in nodes)) and len(nodes) > 1:
        return ("without shared storage each node keeps only its own ranks' ZeRO slices, and a lost node's "
                "are gone with it (set cluster.shared_storage: true when output_dir is on storage every node sees)")
    if t.offload != "none":
        return f"resuming offloaded optimizer state (offload: {t.offload}) on another world size is not supported"
    if t.method == "qlora":
        return "resuming Q-LoRA under ZeRO on another world size is not supported"
    return None


def common_checkpoint(listings: Mapping[int, Iterable[str]]) -> int | None:
    """The newest checkpoint step that every node lists complete (None when there is none): without
    shared storage each node resumes from its own copy, and they must all start from the same step."""
    steps: set[int] | None = None
    for names in listings.values():
        mine = {int(m.group(1)) for n in names if (m := CKPT_NAME.match(n.strip()))}
        steps = mine if steps is None else steps & mine
    return max(steps) if steps else None


def why_not_restart(status: RunState, failed_rank: int | None, cause: str | None, restarts_made: int,
                    allowed: int) -> str | None:
    """None when a failed attempt should be followed by another; else why not, for the user."""
    if status != RunState.FAILED:
        return f"the run ended {status}"
    if restarts_made >= allowed:
        return (f"no restart left (training.restarts: {allowed})" if allowed else
                "training.restarts is 0 (set it to relaunch from the last checkpoint after a failure)")
    if failed_rank is None:
        return "no node failed (the run ran out of time or its training reported an error)"
    if cause in NOT_TRANSIENT:
        return f"the cause ({cause}) would fail the next attempt the same way"
    return None


def recovery_notes(preset: Preset, exclude_failed: bool) -> list[str]:
    """What the user should know before a run whose recovery settings cannot do what they suggest."""
    t, notes = preset.training, []
    if exclude_failed and not t.restarts:
        notes.append("--exclude-failed does nothing with training.restarts: 0 (a failure ends the run)")
    if t.restarts and t.save_strategy == "no":
        notes.append(f"training.restarts: {t.restarts}, but training.save_strategy is no: there is no checkpoint "
                     "to resume from, so a relaunch starts over from step 0")
    why = zero_resume_blocker(preset) if t.zero_stage is not None else None
    if t.restarts and exclude_failed and why and len(preset.cluster.nodes) > 1:
        notes.append(f"with ZeRO-{t.zero_stage}, a failed node can be left out only before the first checkpoint: "
                     f"{why}")
    return notes
