"""A checkpoint is whole only when its manifest, written last, checks out (training/checkpoints/manifest.py); rotation
counts whole checkpoints only, so a damaged newer one never pushes out the last complete one; a staged checkpoint
that lacks a rank's part is never given a manifest. Plain files, no training: the worker's runs that write and skip
real checkpoints are in test_train.py (one process) and test_moe.py (2 ZeRO-3 ranks)."""

from __future__ import annotations

import json

import pytest

from training.checkpoints import directories as ckpt
from training.checkpoints import manifest


def _checkpoint(out, step, ranks=(0, 1)):
    d = out / f"checkpoint-{step}"
    (d / "ds").mkdir(parents=True)
    (d / ckpt.STATE_FILE).write_text(json.dumps({"step": step, "lineage": "L"}))
    for r in ranks:
        (d / f"rng_state_{r}.pth").write_bytes(b"r")
        (d / "ds" / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"x" * 64)
    manifest.write(d, step, 2, ranks)
    return d


def test_rotation_keeps_the_last_whole_checkpoint_when_a_newer_one_is_damaged(tmp_path):
    for s in (10, 20, 30):
        _checkpoint(tmp_path, s)
    (tmp_path / "checkpoint-30" / "ds" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    gone = ckpt.rotate(str(tmp_path), 1, "L")
    assert [p.name for p in gone] == ["checkpoint-10"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-20", "checkpoint-30"]
    assert [s for s, _ in ckpt.complete_checkpoints(tmp_path)] == [20]
    assert ckpt.skipped_lines(tmp_path) == [
        "checkpoint-30 is skipped: incomplete, ds/zero_pp_rank_1_mp_rank_00_optim_states.pt is missing"]
    assert ckpt.resolve_resume("auto", str(tmp_path)).name == "checkpoint-20"


def test_a_checkpoint_without_a_ranks_part_gets_no_manifest_and_a_named_damaged_one_is_refused(tmp_path):
    d = tmp_path / "checkpoint-5"
    d.mkdir()
    (d / "rng_state_0.pth").write_bytes(b"r")
    with pytest.raises(RuntimeError, match=r"lacks rank 1's RNG state \(rng_state_1.pth\)"):
        manifest.write(d, 5, 2, range(2))
    assert not (d / manifest.MANIFEST).exists()
    good = _checkpoint(tmp_path, 7)
    (good / ckpt.STATE_FILE).write_text("{}  ")  # changed after it was saved
    from training.runtime.errors import InputError

    with pytest.raises(InputError, match="not a complete checkpoint: finetune_state.json is 4 bytes"):
        ckpt.resolve_resume(str(good), str(tmp_path))
