"""Hostile data files: the worker's reader ends in exit 2 naming file, line and record,
with nothing written; a record far past model_max_length costs what its cut costs."""

from __future__ import annotations

import json
import time

import pytest

from support.worker import demo_records, run_worker, write_jsonl
from training.data.encoding import ChatEncoder
from training.data.records import load_conversations
from training.runtime.errors import InputError

GOOD = json.dumps({"id": "ok", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})

CASES = {
    "deep_jsonl": (GOOD + "\n" + GOOD + "\n" + "[" * 50000 + "\n", r":3: record 2: nested more than"),
    "deep_object": (GOOD + "\n" + '{"a":' * 20000 + "1" + "}" * 20000 + "\n", r":2: record 1: nested more than"),
    "huge_id": (GOOD + "\n" + GOOD.replace('"ok"', "9" * 5000) + "\n", r":2: record 1: a number of more than 4300"),
    "surrogate": (GOOD + "\n" + GOOD.replace('"a"}', '"x\\ud800y"}') + "\n",
                  r":2: record 1 \(id 'ok'\): messages\[1\]\.content holds a lone surrogate"),
    "deep_array": ("[\n" + GOOD + ",\n" + GOOD + ",\n" + "[" * 50000 + "\n]", r":4: record 2: nested more than"),
    "huge_int_array": ("[\n" + GOOD + ",\n" + GOOD.replace('"ok"', "1" * 5000) + "\n]",
                       r":3: record 1: a number of more than 4300"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_records_are_one_clear_input_error(tmp_path, case):
    import re

    text, pattern = CASES[case]
    f = tmp_path / "d.jsonl"
    f.write_text(text, encoding="utf-8", errors="surrogatepass")
    with pytest.raises(InputError) as e:
        load_conversations(str(f))
    msg = str(e.value)
    assert msg.startswith(str(f)) and re.search(pattern, msg), msg
    assert "\n" not in msg and len(msg) < 400


def test_invalid_utf8_is_reported_by_line(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_bytes((GOOD + "\n" + GOOD + "\n").encode() + b'{"id": "b\xff\xfead"}\n')
    with pytest.raises(InputError, match=r"d\.jsonl:3: not UTF-8 text \(byte \d+, column 10"):
        load_conversations(str(f))


@pytest.mark.parametrize("case", ["deep_jsonl", "surrogate"])
def test_worker_exits_2_without_traceback_and_writes_nothing(tmp_path, tiny_model, case):
    f = tmp_path / "d.jsonl"
    f.write_text(CASES[case][0], encoding="utf-8", errors="surrogatepass")
    before = f.read_bytes()
    out = tmp_path / "out"
    run = run_worker(out, "--model_name_or_path", str(tiny_model), "--data_path", str(f), "--use_cpu",
                     "--max_steps", "1", "--metrics_file", str(tmp_path / "m.jsonl"), timeout=240)
    assert run.rc == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert f"{f}:" in run.stderr and "record " in run.stderr
    assert not out.exists() and not (tmp_path / "m.jsonl").exists()
    assert f.read_bytes() == before


def test_a_huge_record_is_tokenized_only_as_far_as_it_is_cut(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    seen: list[int] = []
    real_call = type(tok).__call__

    class Spy(type(tok)):  # records how much text each tokenizer call is given
        def __call__(self, text, *a, **kw):
            seen.append(len(text))
            return real_call(self, text, *a, **kw)

    tok.__class__ = Spy
    huge = {"id": "huge", "messages": [{"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": "lorem ipsum dolor " * 300_000}]}
    enc = ChatEncoder(tok, 64)
    seen.clear()
    t0 = time.monotonic()
    (conv,) = load_conversations(str(write_jsonl(tmp_path / "d.jsonl", [huge])))
    e = enc.encode(conv)
    assert time.monotonic() - t0 < 20
    assert e.truncated and len(e.input_ids) == 64
    assert max(seen) < 20_000, seen  # 5 MB of text, a few thousand characters tokenized

    # the cut is the full tokenization's own first tokens and labels
    tok.__class__ = type(tok).__mro__[1]
    medium = {"id": "medium", "messages": [{"role": "user", "content": "hi " * 50},
                                           {"role": "assistant", "content": "lorem ipsum dolor " * 400}]}
    for rec in [medium, *demo_records(8)]:
        (c,) = load_conversations(str(write_jsonl(tmp_path / "one.jsonl", [rec])))
        full = ChatEncoder(tok, 10 ** 6).encode(c)
        for n in (16, 64):
            bounded = ChatEncoder(tok, n).encode(c)
            assert bounded.input_ids == full.input_ids[:n] and bounded.labels == full.labels[:n], (rec, n)
            assert bounded.truncated == (len(full.input_ids) > n)
