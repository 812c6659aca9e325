"""Sequence parallelism (--sequence_parallel_size, training.fast.sequence_parallel) on CPU with the tiny model.

Two processes with --sequence_parallel_size 2 are one data-parallel replica that splits every packed row in
two: each rank embeds, runs the MLPs and the loss for half of the row's tokens, and DeepSpeed's Ulysses
all-to-alls give every rank whole rows for half of the attention heads. The records are longer than half a row
(one record a row), so every record is cut between the ranks. The curve (loss and gradient norm, step by step)
must be the one process's on the same records: the loss is the summed token loss over the supervised tokens
of the whole step, each counted once, and the gradient the sum of both halves' contributions.
"""

from __future__ import annotations

import json

import pytest
import torch

from support.long_records import MAX_LEN, STEPS, flags, record_lengths
from support.worker import assert_ok, demo_records, run_worker, write_jsonl
from training.fast import sequence_parallel as sp
from training.fast.packing import pack
from training.finetune import main
from training.runtime.errors import InputError


class _Rec:
    def __init__(self, ids, labels):
        self.input_ids, self.labels = ids, labels


def test_shares_of_a_row_rebuild_it_and_split_its_supervised_tokens():
    recs = [_Rec(list(range(10, 23)), [-100] * 5 + list(range(15, 23))),
            _Rec(list(range(40, 47)), [-100, -100] + list(range(42, 47)))]
    row = pack(recs, 40, pad_id=0, pad_multiple=None, max_segment=16)  # 20 tokens of records, 20 of padding
    for size in (2, 3, 4):
        shares = [sp.shard_row(row, size, r, pad_id=0) for r in range(size)]
        width = shares[0]["sp_share"][2]
        assert width % size == 0 and width >= 40 and {s["input_ids"].shape[1] for s in shares} == {width // size}
        ids = torch.cat([s["input_ids"] for s in shares], dim=1)
        assert torch.equal(ids[:, :40], row["input_ids"]) and (ids[:, 40:] == 0).all()
        assert torch.equal(torch.cat([s["position_ids"] for s in shares], dim=1)[:, :40], row["position_ids"])
        # Every rank keeps the whole row's boundaries (the attention sees the whole row), a padding one added.
        assert all(torch.equal(s["cu_seq_lens"], shares[0]["cu_seq_lens"]) for s in shares)
        assert int(shares[0]["cu_seq_lens"][-1]) == width
        # The supervised positions (shifted labels) are split between the shares, none lost or doubled.
        glob = torch.cat([s["loss_positions"] + s["sp_share"][0] for s in shares])
        assert torch.equal(glob, row["loss_positions"])
        assert torch.equal(torch.cat([s["loss_targets"] for s in shares]), row["loss_targets"])
    # Cut in four shares of 10: token 9 (share 0's last) predicts token 10's label (share 1's first), and that
    # prediction is share 0's: labels were shifted before the cut.
    first = sp.shard_row(row, 4, 0, pad_id=0)
    assert first["loss_positions"].tolist()[-1] == 9 and int(first["loss_targets"][-1]) == int(row["labels"][0, 10])


@pytest.mark.parametrize("size,world,heads,kv,message", [
    (3, 4, 4, 2, "does not divide the 4 process(es)"),
    (4, 4, 6, 2, "6 attention heads do not divide among 4 ranks"),
    (4, 8, 12, 6, "6 key/value heads and 4 ranks: one must divide the other (try 2, 3, 6, 12)"),
])
def test_shapes_ulysses_cannot_split_are_refused_naming_the_flag(size, world, heads, kv, message):
    with pytest.raises(InputError) as e:
        sp.check_shape(size, world, {"num_attention_heads": heads, "num_key_value_heads": kv})
    assert "--sequence_parallel_size" in str(e.value) and message in str(e.value)
    # Fewer KV heads than ranks is fine (each rank gets a copy), as is one rank.
    sp.check_shape(8, 8, {"num_attention_heads": 16, "num_key_value_heads": 2})
    sp.check_shape(1, 3, {"num_attention_heads": 7, "num_key_value_heads": 7})


def test_sequence_parallelism_needs_packing_and_leaves_compiling_to_the_user():
    from support.worker import decide_for, parsed_flags

    def given(*extra):
        return parsed_flags(["--sequence_parallel_size", "2", *extra]).fast

    with pytest.raises(InputError, match="--sequence_parallel_size 2 shards packed rows; it needs packing"):
        sp.check_fast_path(2, given("--no_packing"), decide_for(["--no_packing"]))
    fast = decide_for(["--compile"])  # as given: kept
    sp.check_fast_path(2, given("--compile"), fast)
    assert fast.compile is True and fast.labelled_logits is True
    fast = decide_for(["--compile"])  # chosen automatically (as on CUDA): turned off, with the reason
    sp.check_fast_path(2, given(), fast)
    assert fast.compile is False and "sequence parallelism" in fast.why["compile"]


def test_more_ranks_a_group_than_processes_exits_2(tmp_path, capsys, tiny_model):
    data = write_jsonl(tmp_path / "d.jsonl", demo_records(16))
    out = tmp_path / "out"
    rc = main(["--output_dir", str(out), "--model_name_or_path", str(tiny_model), "--data_path", str(data),
               "--sequence_parallel_size", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "error: --sequence_parallel_size 2 does not divide the 1 process(es)" in err, err[-2000:]
    assert not out.exists()


# ------------------------------------------------------------------ the worker over two processes
@pytest.mark.slow
@pytest.mark.parametrize("config,extra", [
    ("zero2", []),
    ("zero3", ["--gradient_checkpointing"]),  # recomputed layers repeat their all-to-alls in the backward
    ("ddp", []),
], ids=["zero2", "zero3-checkpointing", "ddp"])
def test_two_ranks_of_one_sequence_reproduce_one_process(tmp_path, long_files, long_one, config, extra):
    lengths = record_lengths(long_files)
    assert min(lengths) > MAX_LEN // 2 and max(lengths) <= MAX_LEN, lengths  # one record a row, cut in two
    engine = [] if config == "ddp" else ["--deepspeed", f"builtin:{config}"]
    run = run_worker(tmp_path / "out", *flags(long_files, *engine, "--sequence_parallel_size", "2", *extra),
                     nproc=2)
    assert_ok(run)
    # Ulysses starts DeepSpeed's communication itself (plain DDP too): its CPU op for inference is not built
    assert "shm_comm" not in run.stdout + run.stderr
    start = run.records[0]
    assert start["world_size"] == 2 and start["sequence_parallel_size"] == 2
    assert start["zero_stage"] == (int(config[-1]) if engine else long_one.records[0]["zero_stage"])
    assert start["global_batch_size"] == long_one.records[0]["global_batch_size"] == 2  # one data replica, not two
    assert start["fast_path"]["labelled_logits"] is True and start["fast_path"]["packing"] is True
    assert "sequence parallelism: 2 ranks a group (1 group(s)), rank 0 holds share 0" in run.stderr
    assert [r["step"] for r in run.steps] == [r["step"] for r in long_one.steps] == list(range(1, STEPS + 1))
    for a, b in zip(run.steps, long_one.steps):
        # The same float32 sums in another order (ZeRO's flat partitions, attention per head group): 1e-4 is
        # far above what that moves (measured ~1e-7) and far below a share's loss dropped or counted twice
        # (a factor of ~2) or a gradient scaled by the group size.
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), (a, b)
        # Tokens counted once, not once per rank of the group.
        assert a["tokens"] == b["tokens"] and a["label_tokens"] == b["label_tokens"], (a, b)
        assert a["micro_batches"] == 2  # one record a row: two rows a step, each cut between the ranks
    # Evaluation steps SP aside: each rank evaluates whole records of its own, padded batches, full attention.
    (ev,), (ev_one,) = run.event("eval"), long_one.event("eval")
    assert ev["eval_tokens"] == ev_one["eval_tokens"]
    assert ev["eval_loss"] == pytest.approx(ev_one["eval_loss"], rel=1e-4)
    losses = [r["loss"] for r in run.steps]
    assert losses[-1] < losses[0] - 0.5, losses
    end = run.records[-1]
    assert end["status"] == "ok"
    if config != "zero3":  # every rank holds whole weights: the two must be identical
        assert end["replicas_in_sync"] is True
    metrics = (run.out / "metrics.jsonl").read_text()
    assert json.loads(metrics.splitlines()[0])["event"] == "start"


def test_data_preview_deals_records_to_groups_and_counts_those_past_a_limit(long_files, capsys):
    """training.datapreview (what `qwen-tui data` runs on the master) with SP 2 on 2 processes: one group, so a
    global batch of 1 x 2 records; and the records longer than a limit (qwen-tui passes the longest a GPU trains)."""
    from training.datapreview import main as preview_main

    rc = preview_main(["--world_size", "2", "--device", "cpu", "--longer_than", "450", "--",
                       *flags(long_files, "--output_dir", "o", "--sequence_parallel_size", "2")])
    out = capsys.readouterr().out
    assert rc == 0, out
    rep = json.loads(out)
    lengths = record_lengths(long_files)
    assert rep["sequence_parallel_size"] == 2 and rep["global_batch_size"] == 2
    assert rep["steps_per_epoch"] == len(lengths) // 2
    assert rep["longer_than"] == {"tokens": 450, "records": sum(1 for n in lengths if n > 450),
                                  "longest": max(lengths)}
    assert 0 < rep["longer_than"]["records"] < len(lengths)
