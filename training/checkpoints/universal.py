"""Resuming a DeepSpeed checkpoint on another number of processes, through DeepSpeed's universal format.

ZeRO-2/3 save each rank's slice of the fp32 weights and the Adam states (ds/*zero_pp_rank_R*_optim_states.pt), cut
for the world size that saved them; DeepSpeed's loader refuses them on any other world size. Its converter
(deepspeed.checkpoint.ds_to_universal) merges the slices into one file per parameter and state (fp32, exp_avg,
exp_avg_sq), which an engine of any world size loads with `checkpoint.load_universal`; the model states file
(LR schedule, step counts) is copied along. That is what a relaunch without a lost node needs.

Where: checkpoint-N/universal, beside the ds tag it is made from, so rotation deletes it with its checkpoint and a
later relaunch on yet another world size reuses it. It is written in a staging directory and renamed into place.

Who: the savers (rank 0, or each node's first process with --save_on_each_node) are converter candidates; the
first to create checkpoint-N/universal.lock converts, the others wait for the directory (bounded), and every rank
then meets at a barrier. The converter keeps the lock's mtime fresh, so a lock left by a relaunch that died while
converting is taken over once it is stale. The conversion runs in a subprocess with a time limit.

What cannot be converted is named (UniversalRefused): a checkpoint whose slices are not all in this directory (a
node's copy without shared storage holds only its own ranks' slices, and the lost node's are gone with it).
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from training.runtime import build_lock, dist
from training.runtime.errors import InputError

log = logging.getLogger("training")

TAG = "universal"  # the engine's tag for checkpoint-N/universal (the saved state is tag "ds")
SAVED_TAG = "ds"
POLL_S = 0.5
STALE_S = build_lock.STALE_S
SETTLE_S = 30.0
_RANK_FILE = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


class UniversalRefused(InputError):
    """A checkpoint that cannot be resumed on this world size; the message says why."""


def saved_ranks(ckpt: Path) -> set[int]:
    """The data-parallel ranks whose optimizer slices this copy of the checkpoint holds."""
    found = set()
    for p in glob.glob(str(ckpt / SAVED_TAG / "*_optim_states.pt")):
        m = _RANK_FILE.search(os.path.basename(p))
        if m:
            found.add(int(m.group(1)))
    return found


def saved_world_size(ckpt: Path, state: dict) -> int | None:
    """The world size that saved the checkpoint: finetune_state.json's, else read from its slice files."""
    if state.get("world_size"):
        return int(state["world_size"])
    ranks = saved_ranks(ckpt)
    return max(ranks) + 1 if ranks else None


def is_ready(ckpt: Path) -> bool:
    d = ckpt / TAG
    return (d / "zero" / "optimizer_state.pt").is_file() and bool(glob.glob(str(d / "*model_states.pt")))


def check_convertible(ckpt: Path, saved_world: int) -> None:
    """Refuses (naming the missing ranks) a checkpoint whose optimizer slices are not all in this copy."""
    missing = sorted(set(range(saved_world)) - saved_ranks(ckpt))
    if missing:
        raise UniversalRefused(
            f"{ckpt}: saved by {saved_world} processes under ZeRO, but this copy holds no optimizer slice of "
            f"rank(s) {', '.join(map(str, missing))} (without shared storage each node keeps only its own ranks'); "
            f"it resumes only on {saved_world} processes, on the nodes that saved it")


def convert(ckpt: Path, timeout_s: float) -> Path:
    """Writes checkpoint-N/universal from checkpoint-N/ds (in a staging directory, renamed into place)."""
    final = ckpt / TAG
    stage = ckpt / f".{TAG}.tmp-{socket.gethostname()}-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    # The converter writes a `latest_universal` file beside its output folder: keep it in the staging directory.
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(ckpt / SAVED_TAG),
           "--output_folder", str(stage / TAG), "--num_extract_workers", str(min(4, os.cpu_count() or 1)),
           "--num_merge_workers", "2", "--inject_missing_state"]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        shutil.rmtree(stage, ignore_errors=True)
        raise RuntimeError(f"{ckpt}: converting to DeepSpeed's universal checkpoint took over {timeout_s:g} s "
                           "(raise --ddp_timeout)") from None
    if proc.returncode != 0:
        shutil.rmtree(stage, ignore_errors=True)
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise RuntimeError(f"{ckpt}: DeepSpeed's universal conversion failed (exit {proc.returncode}):\n{tail}")
    os.rename(stage / TAG, final)
    shutil.rmtree(stage, ignore_errors=True)
    log.info("converted %s to DeepSpeed's universal checkpoint %s in %.1f s", ckpt, final, time.monotonic() - t0)
    return final


def ensure(ckpt: Path, saved_world: int, candidate: bool, timeout_s: float, device) -> Path:
    """checkpoint-N/universal, converted once: by one candidate per directory, the others waiting for it.
    Collective (every rank calls it); raises on every rank when it cannot be had."""
    error = None
    if candidate:
        try:
            if not is_ready(ckpt):
                check_convertible(ckpt, saved_world)
                _convert_once(ckpt, timeout_s)
        except Exception as e:  # re-raised below, once every rank knows (the others would wait out the timeout)
            error = e
    failed = [r for r, f in enumerate(dist.all_gather_floats(float(error is not None), device)) if f]
    if error is not None:
        raise error
    if failed:
        raise UniversalRefused(f"{ckpt}: converting it to DeepSpeed's universal checkpoint failed on rank(s) "
                               f"{', '.join(map(str, failed))} (their log says why)")
    settle = time.monotonic() + SETTLE_S  # a network file system may show another node's rename late
    while not is_ready(ckpt) and time.monotonic() < settle:
        time.sleep(POLL_S)
    if not is_ready(ckpt):
        raise UniversalRefused(f"{ckpt}: no universal checkpoint in {ckpt / TAG} on this node (no process here "
                               "converted it, and no other node's conversion is visible: is the storage shared?)")
    return ckpt / TAG


def _convert_once(ckpt: Path, timeout_s: float) -> None:
    lock = ckpt / f"{TAG}.lock"
    deadline = time.monotonic() + timeout_s
    while not is_ready(ckpt):
        if build_lock.take(lock, log, "taking over the stale conversion lock"):
            try:
                with build_lock.Heartbeat(lock, "universal-heartbeat"):
                    if not is_ready(ckpt):  # another converter finished between our look and the lock
                        convert(ckpt, max(1.0, deadline - time.monotonic()))
            finally:
                lock.unlink(missing_ok=True)
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:g} s for the universal checkpoint {ckpt / TAG} "
                               f"(lock {lock} held by {build_lock.holder(lock, 'nobody now')})")
        time.sleep(POLL_S)
