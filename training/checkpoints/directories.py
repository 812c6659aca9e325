"""Checkpoint directories: naming, completeness, rotation and atomic publication.

A checkpoint is written into `checkpoint-N.tmp` and renamed to `checkpoint-N`
only when every process has finished writing; its manifest (manifest.py: every
file and its size, the step, the world size and ranks) is written last, before
the rename. A directory named `checkpoint-N` can still be damaged later (a full
disk, a partial copy, a lost shard): only one whose manifest checks out is
complete, and resume and rotation count only those. The recipe decides what goes
inside.

The state file was called `trainer_state.json` before, HF Trainer's name with another schema (HF's
tools read it as theirs); checkpoints written under that name are still found and resumed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path

from training.checkpoints import manifest
from training.runtime.errors import InputError

log = logging.getLogger("training")

CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "finetune_state.json"
LEGACY_STATE_FILE = "trainer_state.json"  # the same schema, under HF Trainer's name (older checkpoints)


def state_file(ckpt: Path) -> Path | None:
    """The checkpoint's state file, under today's name or the legacy one; None when neither is there."""
    for name in (STATE_FILE, LEGACY_STATE_FILE):
        if (ckpt / name).is_file():
            return ckpt / name
    return None


def checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path, str | None]]:
    """Every checkpoint-N directory in output_dir, by step: (step, path, why it is incomplete or None)."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = []
    for p in out.iterdir():
        m = CKPT_RE.match(p.name)
        if m and p.is_dir():
            step = int(m.group(1))
            why = None if state_file(p) is not None else f"no {STATE_FILE}"
            found.append((step, p, why or manifest.incomplete(p, step)))
    return sorted(found)


def complete_checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """The whole checkpoints in output_dir, by step: their manifest is there and so is every file it lists."""
    return [(s, p) for s, p, why in checkpoints(output_dir) if why is None]


def skipped_lines(output_dir: str | os.PathLike) -> list[str]:
    """One line per checkpoint that resume and rotation pass over, saying which and why."""
    return [f"{p.name} is skipped: incomplete, {why}" for _, p, why in checkpoints(output_dir) if why is not None]


def resolve_resume(arg: str | None, output_dir: str) -> Path | None:
    """`auto` -> the latest complete checkpoint in output_dir (None when there is none yet).

    Under torchrun the ranks agree first (training.checkpoints.resume_agreement): with a copy of the checkpoints on each
    node, `auto` is the newest step every node holds complete, and an explicit checkpoint must be complete on
    every node; otherwise every rank refuses, naming the nodes."""
    if not arg:
        return None
    if arg == "auto":
        for line in skipped_lines(output_dir):
            log.warning("--resume_from_checkpoint auto: %s", line)
        found = complete_checkpoints(output_dir)
        step = _agreed(found, None)
        if step is _ALONE:
            return found[-1][1] if found else None
        return dict(found)[step] if step is not None else None
    p = Path(arg)
    m = CKPT_RE.match(p.name)
    if m:  # every node must hold this step complete: ask the others before refusing alone
        step = int(m.group(1))
        _agreed([(s, c) for s, c in complete_checkpoints(p.parent) if s == step], step)
    if not p.is_dir():
        raise InputError(f"--resume_from_checkpoint {arg}: no such directory")
    if state_file(p) is None:
        raise InputError(f"--resume_from_checkpoint {arg}: not a complete checkpoint (no {STATE_FILE})")
    why = manifest.incomplete(p, int(m.group(1)) if m else None)
    if why is not None and (p / manifest.MANIFEST).is_file():
        raise InputError(f"--resume_from_checkpoint {arg}: not a complete checkpoint: {why}")
    if why is not None:  # named by the user, from before manifests: taken as it is, and said
        log.warning("--resume_from_checkpoint %s: %s; resuming from it as asked", arg, why)
    return p


_ALONE = object()


def _agreed(found: list[tuple[int, Path]], want: int | None):
    """The step the ranks agreed on (None: start afresh), or _ALONE where there are no other ranks to ask."""
    from training.checkpoints import resume_agreement

    timeout = float(os.environ.get("QWEN_TUI_NCCL_TIMEOUT") or 1800)
    holds = resume_agreement.gather_holds([s for s, _ in found], timeout)
    if holds is None:
        return _ALONE
    return resume_agreement.choose(holds, want)


def read_state(ckpt: Path) -> dict:
    path = state_file(ckpt) or ckpt / STATE_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: unreadable checkpoint state: {e}") from None


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def staging_dir(output_dir: str, step: int) -> tuple[Path, Path]:
    return Path(output_dir) / f"checkpoint-{step}.tmp", Path(output_dir) / f"checkpoint-{step}"


def clear(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def publish(tmp: Path, final: Path) -> None:
    """Makes a fully written checkpoint visible under its final name."""
    if final.exists():
        # The same step written again (a run resumed from an earlier checkpoint): the new one wins.
        old = final.with_name(final.name + ".old")
        clear(old)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)


def rotate(output_dir: str, limit: int | None, lineage: str | None = None) -> list[Path]:
    """Deletes the oldest complete checkpoints beyond `limit`; returns what it deleted. With `lineage`, only this
    run's checkpoints count (their state names the lineage: written by this run or the runs it resumed): another
    run's in the same directory are never deleted, and their higher steps never push out this run's own."""
    if not limit or limit <= 0:
        return []
    # whole checkpoints only: a damaged newer one never pushes out the last complete one
    found = complete_checkpoints(output_dir)
    if lineage is not None:
        found = [(s, p) for s, p in found if _lineage(p) == lineage]
    doomed = [p for _, p in found[:-limit]]
    for p in doomed:
        shutil.rmtree(p)
    return doomed


def _lineage(ckpt: Path) -> str | None:
    try:
        return json.loads((state_file(ckpt) or ckpt / STATE_FILE).read_text(encoding="utf-8")).get("lineage")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None  # unreadable: not provably this run's, so never deleted


def move_contents(src: Path, dst: Path) -> None:
    """Moves every file of src into dst (each rename is atomic) and removes src."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir()):
        target = dst / p.name
        if p.is_dir():
            clear(target)
        os.replace(p, target)
    src.rmdir()
