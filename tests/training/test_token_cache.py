"""Tokenize once (training/data/token_cache.py): the key, the file, who builds and who waits.

In-process tests drive one rank by its LOCAL_RANK; the torchrun tests run two real gloo ranks that share the
cache and count, in their logs, how often it was built, reused and loaded."""

from __future__ import annotations

import json
import os
import time

import pytest

from support.worker import assert_ok, demo_records, run_worker, write_jsonl


@pytest.fixture
def cache(tmp_path, monkeypatch):
    from training.data import token_cache

    monkeypatch.setenv("QWEN_TUI_RUN_ID", "job-a")
    monkeypatch.setenv("LOCAL_RANK", "0")
    old = token_cache.settings()
    s = token_cache.configure(str(tmp_path / "tok"), timeout_s=5)
    yield s
    token_cache._settings = old


def _encoder(tiny_model, max_length=64):
    from transformers import AutoTokenizer

    from training.data.encoding import ChatEncoder

    return ChatEncoder(AutoTokenizer.from_pretrained(str(tiny_model)), max_length)


def _convs(tmp_path, n=24, name="d.jsonl", records=None):
    from training.data.records import load_conversations

    return load_conversations(str(write_jsonl(tmp_path / name, records or demo_records(n))))


def _build(tmp_path, tiny_model, max_length=64, convs=None):
    from training.data.batches import build_dataset

    return build_dataset(convs or _convs(tmp_path), _encoder(tiny_model, max_length), lazy=False)


def test_loaded_cache_equals_the_fresh_tokenization(tmp_path, tiny_model, cache, caplog):
    from training.data.encoding import EagerDataset

    caplog.set_level("INFO", logger="training.token_cache")
    convs = _convs(tmp_path, records=demo_records(24) + [{"messages": [
        {"role": "user", "content": "long " * 200}, {"role": "assistant", "content": "cut " * 200}]}])
    fresh = EagerDataset(convs, _encoder(tiny_model))
    first = _build(tmp_path, tiny_model, convs=convs)
    second = _build(tmp_path, tiny_model, convs=convs)
    text = caplog.text
    assert text.count("tokenized cache built") == 1 and text.count("tokenized cache reused") == 1, text
    assert fresh.stats.truncated >= 1
    for ds in (first, second):
        assert [e.input_ids for e in ds.items] == [e.input_ids for e in fresh.items]
        assert [e.labels for e in ds.items] == [e.labels for e in fresh.items]
        assert [e.truncated for e in ds.items] == [e.truncated for e in fresh.items]
        assert ds.stats == fresh.stats
    assert len(list(cache.directory.glob("*.pt"))) == 1
    assert not list(cache.directory.glob("*.lock")) and not list(cache.directory.glob(".*tmp"))


def test_key_follows_data_tokenizer_template_and_max_length(tmp_path, tiny_model):
    from training.data.token_cache import cache_key

    convs = _convs(tmp_path)
    enc = _encoder(tiny_model)
    base = cache_key(convs, enc)
    assert cache_key(_convs(tmp_path, name="same.jsonl"), _encoder(tiny_model)) == base  # same bytes elsewhere
    changed = demo_records(24)
    changed[3]["conversations"][-1]["value"] += "!"
    assert cache_key(_convs(tmp_path, records=changed, name="c.jsonl"), enc) != base
    assert cache_key(convs, _encoder(tiny_model, max_length=65)) != base
    other = _encoder(tiny_model)
    other.tok.chat_template = other.tok.chat_template.replace("<|im_start|>", "<|im_start|> ")
    assert cache_key(convs, other) != base
    added = _encoder(tiny_model)
    added.tok.add_tokens(["zzqq"])
    assert cache_key(convs, added) != base
    assert cache_key(list(convs), enc) != base and cache_key(list(convs), enc) == cache_key(list(convs), enc)


def test_a_waiting_rank_times_out_with_a_clear_error(tmp_path, tiny_model, cache, monkeypatch):
    from training.data import token_cache

    monkeypatch.setenv("LOCAL_RANK", "1")  # not a builder: nobody builds for it
    token_cache.configure(str(cache.directory), timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"waited 0.5 s for the tokenized cache .*--tokenize_timeout"):
        _build(tmp_path, tiny_model)
    assert time.monotonic() - t0 < 5


def test_a_waiter_loads_what_the_builder_wrote_and_raises_its_failure(tmp_path, tiny_model, cache, monkeypatch):
    from training.data.batches import build_dataset
    from training.data.token_cache import cache_key
    from training.runtime.errors import InputError

    convs = _convs(tmp_path)
    key = cache_key(convs, _encoder(tiny_model))
    note = cache.directory / f"{key}.failed"
    cache.directory.mkdir(parents=True)
    note.write_text(json.dumps({"host": "node7", "pid": 12, "job": "job-a", "error": "record 3: bad turn",
                                "input_error": True}))
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(InputError, match="failed on node7 pid 12: record 3: bad turn"):
        build_dataset(convs, _encoder(tiny_model), lazy=False)
    # a note of an earlier job is not this run's failure: the waiter waits (here, out its bound)
    note.write_text(json.dumps({"host": "node7", "pid": 12, "job": "job-old", "error": "x", "input_error": True}))
    from training.data import token_cache

    token_cache.configure(str(cache.directory), timeout_s=0.5)
    with pytest.raises(TimeoutError):
        build_dataset(convs, _encoder(tiny_model), lazy=False)


def test_the_builder_leaves_a_failure_note_and_no_cache(tmp_path, tiny_model, cache):
    from training.runtime.errors import InputError

    bad = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}]
    enc = _encoder(tiny_model)
    enc.tok.chat_template = "{% for m in messages %}{{ m['role'] }}{% endfor %}"  # drops every reply
    from training.data.batches import build_dataset

    with pytest.raises(InputError, match="dropped or rewrote"):
        build_dataset(_convs(tmp_path, records=bad), enc, lazy=False)
    notes = list(cache.directory.glob("*.failed"))
    assert len(notes) == 1 and json.loads(notes[0].read_text())["input_error"] is True
    assert not list(cache.directory.glob("*.pt")) and not list(cache.directory.glob("*.lock"))


def test_a_stale_lock_is_taken_over_and_a_corrupt_file_rebuilt(tmp_path, tiny_model, cache, caplog):
    from training.data.token_cache import STALE_S, cache_key

    caplog.set_level("INFO", logger="training.token_cache")
    convs = _convs(tmp_path)
    key = cache_key(convs, _encoder(tiny_model))
    cache.directory.mkdir(parents=True)
    lock = cache.directory / f"{key}.lock"
    lock.write_text(json.dumps({"host": "gone", "pid": 1}))
    old = time.time() - STALE_S - 5
    os.utime(lock, (old, old))
    _build(tmp_path, tiny_model, convs=convs)
    assert "taking over the stale build lock" in caplog.text and "tokenized cache built" in caplog.text
    (cache.directory / f"{key}.pt").write_bytes(b"not a torch file")
    caplog.clear()
    ds = _build(tmp_path, tiny_model, convs=convs)
    assert "unreadable" in caplog.text and "tokenized cache built" in caplog.text and len(ds) > 0


def test_none_disables_the_cache(tmp_path, tiny_model, cache, caplog):
    from training.data import token_cache

    caplog.set_level("INFO", logger="training.token_cache")
    token_cache.configure("none", 5)
    _build(tmp_path, tiny_model)
    assert "tokenized cache" not in caplog.text and not cache.directory.exists()


def _count(stderr: str) -> dict[str, int]:
    return {w: stderr.count(f"tokenized cache {w}:") for w in ("built", "reused", "loaded")}


def test_two_gloo_ranks_tokenize_once_and_a_second_run_reuses_it(tmp_path, tiny_model):
    data = write_jsonl(tmp_path / "chat.jsonl", demo_records(48))
    flags = ["--model_name_or_path", str(tiny_model), "--data_path", str(data), "--use_cpu", "--use_lora",
             "--max_steps", "3", "--per_device_train_batch_size", "2", "--model_max_length", "64",
             "--save_strategy", "no", "--learning_rate", "2e-3", "--tokenized_cache_dir", str(tmp_path / "tok")]
    first = run_worker(tmp_path / "a", *flags, nproc=2)
    assert_ok(first)
    assert _count(first.stderr) == {"built": 1, "reused": 0, "loaded": 1}, first.stderr[-3000:]
    second = run_worker(tmp_path / "b", *flags, nproc=2)
    assert_ok(second)
    assert _count(second.stderr) == {"built": 0, "reused": 1, "loaded": 1}, second.stderr[-3000:]
    # the cached tokens train exactly as fresh ones: the same losses as without the cache
    fresh = run_worker(tmp_path / "c", *flags[:-1], "none", nproc=2)
    assert_ok(fresh)
    assert _count(fresh.stderr) == {"built": 0, "reused": 0, "loaded": 0}
    assert second.losses() == fresh.losses() == first.losses() and len(first.losses()) == 3
