"""Several data sets in one run (--datasets): three sources in three formats and containers, mixed by weight.

Qwen conversations in JSON lines, alpaca rows in Parquet read through LLaMA-Factory's dataset_info.json (its own
column names), OpenAI messages in a datasets.save_to_disk folder. For a fixed seed the counts per source match
the weights within one record, every rank of a 2-process run takes the same mixture (its key is the one the
other rank built), and the mixture is tokenized once.
"""

from __future__ import annotations

import json

import pytest

from support.worker import assert_ok, demo_records, run_worker, write_jsonl
from training.data.sources import counts, load_mixture

WEIGHTS = (0.45, 0.35, 0.2)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset

    d = tmp_path_factory.mktemp("mix")
    recs = demo_records(150)
    qwen = write_jsonl(d / "qwen.jsonl", recs[:60])
    alpaca = [{"question": r["conversations"][-2]["value"], "answer": r["conversations"][-1]["value"]}
              for r in recs[60:100]]
    pq.write_table(pa.Table.from_pylist(alpaca), d / "alpaca.parquet")
    (d / "dataset_info.json").write_text(json.dumps({"my_alpaca": {
        "file_name": "alpaca.parquet", "columns": {"prompt": "question", "response": "answer"}}}))
    openai = [{"messages": [{"role": "user" if t["from"] == "user" else t["from"], "content": t["value"]}
                            for t in r["conversations"]]} for r in recs[100:150]]
    Dataset.from_list(openai).save_to_disk(str(d / "openai_saved"))
    spec = [{"path": str(qwen), "weight": WEIGHTS[0]},
            {"dataset_info": str(d / "dataset_info.json"), "name": "my_alpaca", "weight": WEIGHTS[1]},
            {"path": str(d / "openai_saved"), "weight": WEIGHTS[2]}]
    return {"dir": d, "spec": json.dumps(spec)}


def test_counts_match_the_weights_within_one_record_for_a_seed(sources):
    mix = load_mixture(sources["spec"], seed=11)
    got = [s["records"] for s in mix.summary]
    total = sum(got)
    assert [s["available"] for s in mix.summary] == [60, 40, 50]
    assert [s["format"] for s in mix.summary] == ["auto", "alpaca", "auto"]
    assert total == 114  # as many as the sources hold without a repeat: the alpaca source runs out first
    for n, w in zip(got, WEIGHTS):
        assert abs(n - total * w / sum(WEIGHTS)) <= 1, (got, WEIGHTS)
    again = load_mixture(sources["spec"], seed=11)
    assert again.records.sha256 == mix.records.sha256 and [c.messages for c in again.records] == \
        [c.messages for c in mix.records]
    other = load_mixture(sources["spec"], seed=12)
    assert other.records.sha256 != mix.records.sha256 and [s["records"] for s in other.summary] == got
    # the alpaca rows, read through dataset_info.json's columns, are user + assistant turns
    alpaca = [c for c in mix.records if c.messages[0]["role"] == "user" and len(c.messages) == 2]
    assert alpaca and all(m["content"] for c in alpaca for m in c.messages)


def test_counts_take_records_and_weights_together():
    assert counts([100, 10, 40], [None, 1.0, 1.0], [30, None, None]) == [30, 10, 10]
    assert counts([7, 9], [None, None], [20, None]) == [20, 9]  # past its size: whole passes and a sample
    assert counts([3, 3, 3], [1.0, 1.0, 1.0], [None] * 3) == [3, 3, 3]


def test_two_ranks_take_the_same_mixture_tokenized_once(sources, tiny_model, tmp_path):
    cache = tmp_path / "tok"
    flags = ["--model_name_or_path", str(tiny_model), "--datasets", sources["spec"], "--seed", "11",
             "--max_steps", "1", "--per_device_train_batch_size", "2", "--model_max_length", "128",
             "--save_strategy", "no", "--use_lora", "--use_cpu", "--tokenized_cache_dir", str(cache)]
    run = run_worker(tmp_path / "out", *flags, nproc=2)
    assert_ok(run)
    start = run.event("start")[0]
    assert [s["records"] for s in start["data_sources"]] == [51, 40, 23] and start["records"] == 114
    assert run.stderr.count("tokenized cache built") == 1 and run.stderr.count("tokenized cache loaded") == 1
    assert len(list(cache.glob("*.pt"))) == 1
    assert run.stderr.count("data mixture (seed 11): qwen.jsonl 51/60, my_alpaca 40/40, openai_saved 23/50") == 2
