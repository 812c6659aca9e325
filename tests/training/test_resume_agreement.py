"""Resuming when every node keeps its own checkpoints: the step all nodes agree on
(training.checkpoints.resume_agreement)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from support.paths import ROOT
from support.ports import free_port
from support.worker import demo_records, write_jsonl
from training.checkpoints import manifest
from training.checkpoints.resume_agreement import NodeHolds, choose
from training.runtime.errors import InputError


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
    manifest.write(d, step, 1, [])


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


def _nodes(tmp_path, outs, *extra):
    """A torchrun agent on this machine per output dir in `outs`, as nodes 0, 1, ... (one process each)."""
    data = write_jsonl(tmp_path / "chat.jsonl", demo_records(16))
    port = free_port()
    procs = []
    for rank, out in enumerate(outs):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(outs)), "--node_rank", str(rank),
               "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
               "-m", "training.finetune", "--model_name_or_path", str(extra[0]), "--data_path", str(data),
               "--output_dir", str(out), "--use_cpu", "--use_lora", "--save_on_each_node",
               "--tokenized_cache_dir", "none", *extra[1:]]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                           "OMP_NUM_THREADS": "1"},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs, [p.communicate(timeout=240)[0] for p in procs]


def test_save_on_each_node_into_one_shared_output_dir_saves_once_from_rank_0(tmp_path, tiny_model):
    """Both "nodes" are given the same output_dir (a shared filesystem that the launch did not declare): the
    worker measures it, rank 0 alone saves, and the run's checkpoints and final adapter are whole. Each node
    writing the same files at once failed the run at its first save."""
    out = tmp_path / "out"
    procs, logs = _nodes(tmp_path, [out, out], tiny_model, "--max_steps", "4", "--save_strategy", "steps",
                             "--save_steps", "2")
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
        assert "is one filesystem for every node: rank 0 alone saves" in log, log[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert "checkpoint-2" in names and "checkpoint-4" in names and "adapter_model.safetensors" in names, names
    assert not [n for n in names if n.startswith(".qwen-tui-node-") or n.endswith(".tmp")], names  # no leftovers


def test_an_output_dir_shared_by_some_nodes_but_not_all_is_refused_naming_them(tmp_path, tiny_model):
    """Nodes 0 and 1 share one output_dir, node 2 has its own: no single choice of savers is right, so every
    rank refuses before writing anything, naming which node sees which."""
    shared, own = tmp_path / "shared", tmp_path / "own"  # neither made yet: the markers go in their parent
    procs, logs = _nodes(tmp_path, [shared, shared, own], tiny_model, "--max_steps", "2")
    for p, log in zip(procs, logs):
        assert p.returncode != 0 and re.search(r"exitcode\s*:\s*2\b", log), log[-3000:]
        assert "is shared by some nodes but not all (node 0 sees node(s) 1; node 1 sees node(s) 0; node 2 sees " \
               "none)" in log, log[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl"]  # nothing written, no marker left
