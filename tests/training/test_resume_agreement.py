"""Resuming when every node keeps its own checkpoints: the step all nodes agree on (training.resume_agreement)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest
from worker_helpers import ROOT, demo_records, free_port, write_jsonl

from training.errors import InputError
from training.resume_agreement import NodeHolds, choose


def _h(node, *steps, host=None):
    return NodeHolds(node, host or f"host{node}", frozenset(steps))


def test_newest_step_every_node_holds_wins_and_the_nodes_ahead_are_named(caplog):
    caplog.set_level("WARNING", logger="training")
    holds = [_h(0, 2, 4, 6), _h(0, 2, 4, 6), _h(1, 2, 4), _h(1, 2, 4)]
    assert choose(holds) == 4
    assert "checkpoint-4" in caplog.text and "node 0 (host0) has checkpoint-6" in caplog.text


def test_all_nodes_equal_resume_from_the_newest_quietly(caplog):
    caplog.set_level("WARNING", logger="training")
    assert choose([_h(0, 2, 4), _h(1, 2, 4), _h(2, 4, 2)]) == 4
    assert caplog.text == ""


def test_nothing_anywhere_starts_afresh():
    assert choose([_h(0), _h(1)]) is None


def test_no_common_step_refuses_naming_every_node():
    with pytest.raises(InputError) as e:
        choose([_h(0, 6), _h(1, 2, 4), _h(2)])
    msg = str(e.value)
    assert "no complete checkpoint in common" in msg
    assert "node 0 (host0): checkpoint-6" in msg and "node 1 (host1): checkpoint-2, checkpoint-4" in msg
    assert "node 2 (host2): none" in msg


def test_an_explicit_checkpoint_must_be_on_every_node():
    assert choose([_h(0, 4, 6), _h(1, 4)], want=4) == 4
    with pytest.raises(InputError, match=r"checkpoint-6 is not complete on every node; lacking it: node 1 "
                                         r"\(host1\): checkpoint-4$"):
        choose([_h(0, 4, 6), _h(1, 4)], want=6)


def test_two_ranks_of_one_node_that_see_different_lists_count_what_both_see():
    assert choose([_h(0, 2, 4), _h(0, 2), _h(1, 2, 4)]) == 2


def _fake_checkpoint(out, step):
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "finetune_state.json").write_text(json.dumps({"step": step}))


def test_two_torchrun_nodes_without_a_common_checkpoint_both_refuse_naming_each_other(tmp_path, tiny_model):
    """Two torchrun agents on this machine as nodes 0 and 1, each with its own output dir: the agreement runs
    through torchrun's real store, before any process group, model or file."""
    data = write_jsonl(tmp_path / "chat.jsonl", demo_records(16))
    port = free_port()
    outs = [tmp_path / "out0", tmp_path / "out1"]
    _fake_checkpoint(outs[0], 6)
    for s in (2, 4):
        _fake_checkpoint(outs[1], s)
    procs = []
    for rank, out in enumerate(outs):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(rank),
               "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
               "-m", "training.finetune", "--model_name_or_path", str(tiny_model), "--data_path", str(data),
               "--output_dir", str(out), "--use_cpu", "--use_lora", "--max_steps", "2", "--save_on_each_node",
               "--resume_from_checkpoint", "auto", "--tokenized_cache_dir", "none"]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                           "OMP_NUM_THREADS": "1"},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=180)[0] for p in procs]
    host = socket.gethostname()
    for p, log in zip(procs, logs):
        assert p.returncode != 0 and re.search(r"exitcode\s*:\s*2\b", log), log[-3000:]
        assert (f"no complete checkpoint in common (node 0 ({host}): checkpoint-6; "
                f"node 1 ({host}): checkpoint-2, checkpoint-4)") in log, log[-3000:]
    assert sorted(p.name for p in outs[0].iterdir()) == ["checkpoint-6"]  # nothing written
