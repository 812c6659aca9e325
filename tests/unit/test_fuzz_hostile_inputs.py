"""Seeded fuzzing of the two readers of user files: the preset loader (`qwen-tui check`)
and the worker's data reader (training.records, whose InputError the worker turns into
exit 2). Every generated file is hostile by construction: deep nesting, huge numbers,
duplicate keys, control characters, invalid UTF-8, lone surrogates, binary junk and
alias bombs, one to three of them, at random places. Each must end in a clear error
(exit 2; every line names the file), never a traceback, and leave the file as it was.

The budget is fixed (CASES files per reader, fixed seeds): the same files every run,
a few seconds in CI. A failure prints the seed that reproduces it.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from qwen_tui.cli.main import main
from training.data.records import load_conversations
from training.runtime.errors import InputError

CASES = 120
DEMO = (Path(__file__).resolve().parents[2] / "presets" / "local-demo.yaml").read_text()
LINES = DEMO.splitlines(keepends=True)
CONTROL = [chr(c) for c in range(0x20) if c not in (9, 10)] + ["\x7f"]


def _junk(rng: random.Random, n: int) -> bytes:
    # at least one byte that is never UTF-8, so the junk can never read as text
    return bytes(rng.randrange(256) for _ in range(n)) + b"\xff"


def _insert(rng: random.Random, text: bytes, piece: bytes) -> bytes:
    at = rng.randrange(len(text) + 1)
    return text[:at] + piece + text[at:]


# ---------------------------------------------------------------- presets

def _deep(rng):
    opener = rng.choice(["[", "{a: ", "{a: [", "- "])
    n = rng.choice([65, 70, 500, 5000, 30000])
    if opener == "- ":  # block style: indentation grows with depth
        return "".join("  " * d + "-\n" for d in range(n)).encode()
    return (f"x{rng.randrange(99)}: " + opener * n + "\n").encode()


def _preset_mutation(rng: random.Random, text: bytes, kind: str) -> bytes:
    if kind == "deep":
        return text + b"\n" + _deep(rng)
    if kind == "huge_int":
        digits = "".join(rng.choice("0123456789") for _ in range(rng.choice([101, 4301, 5000, 20000])))
        key = rng.choice(["seed", "max_steps", "lora_r", "save_steps"])
        return text.replace(b"training:\n", f"training:\n  {key}: {rng.choice(['', '-', '+'])}{digits}\n".encode(), 1)
    if kind == "duplicate":
        section = rng.choice(["cluster", "network", "training", "name", "version"])
        if section in ("name", "version"):
            return text + f"{section}: {'other' if section == 'name' else 1}\n".encode()
        return text + f"{section}:\n  {rng.choice(['data', 'backend', 'nodes'])}: x\n".encode()
    if kind == "control":
        ch = rng.choice(CONTROL)
        field = rng.choice(["name", "host"])
        value = f'"demo\\x{ord(ch):02x}tail"' if rng.random() < 0.5 else f'"demo{ch}tail"'
        if field == "name":
            return re.sub(rb"(?m)^name:.*$", lambda m: f"name: {value}".encode(), text, count=1)
        return text.replace(b"- host: localhost", f"- host: {value}".encode(), 1)
    if kind == "utf8":
        return _insert(rng, text, bytes([rng.randrange(0x80, 0x100)]) + b"\xfe")
    if kind == "surrogate":
        s = f'"a\\u{rng.randrange(0xd800, 0xe000):04x}b"'
        target = rng.choice(["name", "description", "data"])
        if target == "data":
            return text.replace(b"data: builtin:demo-chat", f"data: {s}".encode(), 1)
        return re.sub(rb"(?m)^name:.*$", lambda m: f"{target}: {s}".encode(), text, count=1) + (
            b"" if target == "name" else b"\nname: ok\n")
    if kind == "junk":
        return _insert(rng, text, _junk(rng, rng.randrange(1, 64)))
    if kind == "bomb":
        width, depth = rng.choice([(9, 6), (10, 6), (4, 10), (2, 20)])
        bomb = "".join(f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * width) if i else 'x'}]\n" for i in range(depth))
        return bomb.encode() + text if rng.random() < 0.5 else text + b"\n" + bomb.encode()
    raise AssertionError(kind)


PRESET_KINDS = ["deep", "huge_int", "duplicate", "control", "utf8", "surrogate", "junk", "bomb"]


@pytest.mark.parametrize("seed", range(CASES))
def test_fuzzed_preset_is_refused_with_exit_2_naming_the_file(tmp_path, capsys, seed):
    rng = random.Random(seed)
    text = DEMO.encode()
    kinds = rng.sample(PRESET_KINDS, rng.choice([1, 1, 2, 3]))
    for kind in kinds:
        text = _preset_mutation(rng, text, kind)
    f = tmp_path / "p.yaml"
    f.write_bytes(text)
    rc = main(["check", str(f)])  # any exception other than the CLI's own errors fails the test
    err = capsys.readouterr().err
    assert rc == 2, (seed, kinds, err)
    lines = err.strip().splitlines()
    assert lines and all(ln.startswith(f"{f}:") for ln in lines), (seed, kinds, lines)
    assert "Traceback" not in err
    assert f.read_bytes() == text


# ---------------------------------------------------------------- the worker's data

def _good(rng: random.Random, i: int) -> dict:
    if rng.random() < 0.5:
        return {"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"},
                                            {"role": "assistant", "content": f"a{i}"}]}
    return {"id": i, "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]}


def _hostile_record(rng: random.Random, kind: str) -> bytes:
    rec = _good(rng, 99)
    good = json.dumps(rec)
    if kind == "deep":
        opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
        n = rng.choice([2000, 20000, 50000])
        inner = opener * n + "1" + closer * n if rng.random() < 0.5 else opener * n
        return good.replace('"a99"', inner).replace('"q99"', inner).encode() if rng.random() < 0.5 else inner.encode()
    if kind == "huge_int":
        digits = "".join(rng.choice("123456789") for _ in range(rng.choice([4301, 5000, 20000])))
        return re.sub(r'"id": ("r99"|99)', lambda m: f'"id": {digits}', good).encode()
    if kind == "duplicate":
        key = rng.choice(sorted(rec))
        return ("{" + f'"{key}": 1, ' + good[1:]).encode() if key == "id" else good[:-1].encode() + f', "{key}": []}}'.encode()
    if kind == "control":  # raw, unescaped in a JSON string (DEL is text in JSON)
        return good.replace("a99", "a" + rng.choice(CONTROL[:-1]) + "99").encode()
    if kind == "utf8":
        return _insert(rng, good.encode(), bytes([rng.randrange(0x80, 0x100)]) + b"\xfe")
    if kind == "surrogate":
        s = f"\\u{rng.randrange(0xd800, 0xe000):04x}"
        return good.replace(rng.choice(["a99", "q99"]), f"x{s}y").encode()
    if kind == "junk":
        return _junk(rng, rng.randrange(1, 200)).replace(b"\n", b" ")
    if kind == "not_a_record":
        return rng.choice([b"[]", b"42", b'"text"', b"null", b"{}", b'{"messages": {}}'])
    raise AssertionError(kind)


DATA_KINDS = ["deep", "huge_int", "duplicate", "control", "utf8", "surrogate", "junk", "not_a_record"]


@pytest.mark.parametrize("seed", range(CASES))
def test_fuzzed_data_is_one_input_error_naming_file_and_line(tmp_path, seed):
    rng = random.Random(10_000 + seed)
    kind = rng.choice(DATA_KINDS)
    records = [json.dumps(_good(rng, i)).encode() for i in range(rng.randrange(0, 5))]
    at = rng.randrange(len(records) + 1)
    records.insert(at, _hostile_record(rng, kind))
    as_array = rng.random() < 0.3
    text = (b"[\n" + b",\n".join(records) + b"\n]\n") if as_array else b"\n".join(records) + b"\n"
    f = tmp_path / ("d.json" if as_array else "d.jsonl")
    f.write_bytes(text)
    with pytest.raises(InputError) as e:  # the worker exits 2 on InputError (finetune.main)
        load_conversations(str(f))
    msg = str(e.value)
    assert msg.startswith(str(f)) and "\n" not in msg, (seed, kind, msg)
    assert re.match(re.escape(str(f)) + r"(:\d+|: invalid JSON at line \d+)", msg), (seed, kind, msg)
    assert f.read_bytes() == text
