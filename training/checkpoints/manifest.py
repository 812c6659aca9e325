"""A checkpoint's manifest: the proof that it is whole, written last.

A directory named checkpoint-N can still be half a checkpoint: a copy made by hand, a disk that filled up after the
rename, a node that lost its shards, a preemption between one rank's write and another's (DeepSpeed#7546). So once
every rank has written its part (after the save's barrier), the saver lists every file of the staged checkpoint with
its size, the step, the world size and the ranks whose parts it holds, and writes that list as manifest.json last,
atomically (a temporary file, fsync, rename), before the directory is published. A checkpoint is complete when its
manifest is there and every file it lists is there at its size; every rank it names has its RNG state and, under
DeepSpeed ZeRO, its optimizer shard.

`incomplete(ckpt)` says why one is not (None when it is whole): resume skips such a checkpoint with that reason, and
rotation never counts it. A checkpoint written before manifests existed has none: `auto` skips it, naming it (it
can still be resumed by naming it in --resume_from_checkpoint). Standard library only: qwen-tui's restarts check
checkpoints on the nodes with the same rules (qwen_tui/nodes/remote/list_checkpoints.py).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

MANIFEST = "manifest.json"
_RNG = re.compile(r"^rng_state_(\d+)\.pth$")
_SHARD = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def _files(d: Path) -> dict[str, int]:
    out = {}
    for root, _, names in os.walk(d):
        for n in names:
            p = Path(root) / n
            rel = p.relative_to(d).as_posix()
            if rel != MANIFEST and not rel.endswith(".tmp"):
                out[rel] = p.stat().st_size
    return dict(sorted(out.items()))


def _ranks_with(files, rx: re.Pattern) -> set[int]:
    return {int(m.group(1)) for f in files if (m := rx.match(f.rsplit("/", 1)[-1]))}


def missing_parts(files, ranks) -> list[str]:
    """What of each rank's part is not among `files` (paths relative to the checkpoint)."""
    out = []
    rng, shards = _ranks_with(files, _RNG), _ranks_with(files, _SHARD)
    for r in sorted(ranks):
        if r not in rng:
            out.append(f"rank {r}'s RNG state (rng_state_{r}.pth)")
        if shards and r not in shards:
            out.append(f"rank {r}'s ZeRO optimizer shard (zero_pp_rank_{r}_..._optim_states.pt)")
    return out


def write(staged: Path, step: int, world_size: int, ranks) -> dict:
    """The manifest of a staged checkpoint whose every part is written, committed last. Raises RuntimeError when a
    rank's part is missing: such a checkpoint is never published."""
    files = _files(staged)
    lacking = missing_parts(files, ranks)
    if lacking:
        raise RuntimeError(f"{staged}: the checkpoint of step {step} lacks {', '.join(lacking)} after every rank "
                           "finished saving; it is not published")
    m = {"step": step, "world_size": world_size, "ranks": sorted(ranks), "files": files}
    tmp = staged / (MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(m, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, staged / MANIFEST)
    fd = os.open(staged, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself reaches the disk before the directory is published
    finally:
        os.close(fd)
    return m


def incomplete(ckpt: Path, step: int | None = None) -> str | None:
    """Why `ckpt` is not a whole checkpoint, in a few words; None when it is."""
    path = ckpt / MANIFEST
    if not path.is_file():
        return (f"no {MANIFEST} (written last, once every rank's part is saved: the save was cut short, or the "
                "checkpoint predates manifests)")
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
        files, ranks = dict(m["files"]), list(m["ranks"])
        saved_step = int(m["step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} unreadable ({type(e).__name__})"
    if step is not None and saved_step != step:
        return f"{MANIFEST} is of step {saved_step}, not {step}"
    for rel, size in files.items():
        p = ckpt / rel
        try:
            have = p.stat().st_size
        except OSError:
            return f"{rel} is missing"
        if have != size:
            return f"{rel} is {have} bytes, {size} when it was saved (truncated or changed)"
    lacking = missing_parts(files, ranks)
    if lacking:
        return f"the manifest lacks {', '.join(lacking)}"
    return None
