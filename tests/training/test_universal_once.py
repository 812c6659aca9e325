"""training/checkpoints/universal.py without a process group: which world size saved a checkpoint, which copies cannot
be converted (and why), and the one-converter-others-wait lock: a live holder is waited for (with a bound, naming it),
a stale one is taken over, and a failed conversion leaves neither its lock nor a half-written directory."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from training.checkpoints import universal


def ckpt_with_ranks(tmp_path, ranks, stage3=False):
    d = tmp_path / "checkpoint-4"
    (d / "ds").mkdir(parents=True)
    for r in ranks:
        name = f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
        (d / "ds" / (name if stage3 else "bf16_" + name)).write_bytes(b"x")
    return d


def make_ready(d):
    (d / "universal" / "zero").mkdir(parents=True)
    (d / "universal" / "zero" / "optimizer_state.pt").write_bytes(b"x")
    (d / "universal" / "mp_rank_00_model_states.pt").write_bytes(b"x")


def test_the_saving_world_size_comes_from_the_state_else_from_the_slices(tmp_path):
    d = ckpt_with_ranks(tmp_path, [0, 1, 2])
    assert universal.saved_world_size(d, {"world_size": 4}) == 4
    assert universal.saved_world_size(d, {"step": 4}) == 3  # a checkpoint from before the field
    assert universal.saved_ranks(ckpt_with_ranks(tmp_path / "z3", [0, 1], stage3=True)) == {0, 1}


def test_a_copy_without_every_ranks_slice_is_refused_naming_them(tmp_path):
    d = ckpt_with_ranks(tmp_path, [0, 1])  # a node's own copy: ranks 2 and 3 were on the lost node
    with pytest.raises(universal.UniversalRefused) as e:
        universal.check_convertible(d, 4)
    msg = str(e.value)
    assert "saved by 4 processes" in msg and "rank(s) 2, 3" in msg and "resumes only on 4 processes" in msg, msg
    universal.check_convertible(d, 2)  # all there


def test_a_live_converter_is_waited_for_and_not_repeated(tmp_path):
    d = ckpt_with_ranks(tmp_path, [0, 1])
    lock = d / "universal.lock"
    lock.write_text(json.dumps({"host": "node1", "pid": 4242}))
    threading.Timer(1.0, make_ready, [d]).start()  # the other converter finishes
    t0 = time.monotonic()
    universal._convert_once(d, timeout_s=30)
    assert 0.9 < time.monotonic() - t0 < 10 and universal.is_ready(d)
    assert lock.exists()  # not ours to remove


def test_a_wait_for_a_converter_is_bounded_and_names_it(tmp_path):
    d = ckpt_with_ranks(tmp_path, [0, 1])
    (d / "universal.lock").write_text(json.dumps({"host": "node1", "pid": 4242}))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="lock .* held by node1 pid 4242"):
        universal._convert_once(d, timeout_s=1.5)
    assert time.monotonic() - t0 < 10


def test_a_stale_lock_is_taken_over_and_a_failed_conversion_leaves_nothing_behind(tmp_path):
    d = ckpt_with_ranks(tmp_path, [0, 1])  # slice files that are no checkpoint: DeepSpeed's converter fails
    lock = d / "universal.lock"
    lock.write_text(json.dumps({"host": "gone", "pid": 1}))
    old = time.time() - universal.STALE_S - 5
    os.utime(lock, (old, old))
    with pytest.raises(RuntimeError, match="universal conversion failed"):
        universal._convert_once(d, timeout_s=300)
    assert sorted(p.name for p in d.iterdir()) == ["ds"]  # no lock, no staging directory, no universal
