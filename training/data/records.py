"""Reading and checking chat records and preference pairs (pure Python: no torch, no transformers).

One record per JSON object, in a JSON array file or a JSON-lines file, in any format of training.data.formats
(Qwen's and ShareGPT's conversations, OpenAI's messages with tool calls, ms-swift's and LLaMA-Factory's tool turns,
alpaca; for DPO, TRL's, LLaMA-Factory's and ms-swift's preference pairs), detected from the record's keys or given.

Every record becomes a Conversation with OpenAI-style messages and its tools, the form chat templates take (a
preference record two of them, sharing the prompt). Every record is checked before training starts: a bad one
raises InputError naming the file, the record index and id (and the line for JSON lines), the turn and what is
wrong. training.data.sources reads the other containers (Parquet, Arrow, saved data sets) and mixes several.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from training.data import formats
from training.runtime.errors import InputError

BUILTIN_DATA = {"builtin:demo-chat": Path(__file__).parents[1] / "demo_data" / "demo_chat.jsonl",
                "builtin:demo-pref": Path(__file__).parents[1] / "demo_data" / "demo_pref.jsonl"}


@dataclass(frozen=True)
class Conversation:
    index: int  # position in the file, 0-based
    id: str  # the record's own id, or "#index" when it has none
    messages: tuple  # ({"role": ..., "content": ..., "tool_calls": [...]}, ...)
    tools: tuple = ()  # the tools' schemas the template renders ({"type": "function", "function": {...}})
    first_labelled: int = 0  # assistant turns before this message are context (a preference pair's prompt)


@dataclass(frozen=True)
class PreferencePair:
    """One DPO record: the prompt with the chosen answer, and with the rejected one."""
    index: int
    id: str
    chosen: Conversation
    rejected: Conversation


class Records(list):
    """The checked conversations of one file, with the SHA-256 of the file's bytes (the tokenized cache's key)."""

    def __init__(self, items, sha256: str):
        super().__init__(items)
        self.sha256 = sha256


def resolve_data_path(path: str) -> Path:
    if path.startswith("builtin:"):
        if path not in BUILTIN_DATA:
            raise InputError(f"unknown built-in data set {path!r}; known: {', '.join(sorted(BUILTIN_DATA))}")
        return BUILTIN_DATA[path]
    return Path(path)


def other_container(path: str) -> bool:
    """A Parquet or Arrow file, a saved data set's folder or a hub data set (training.data.sources reads those)."""
    if path.startswith("builtin:"):
        return False
    return path.startswith("hf:") or Path(path).suffix in (".parquet", ".arrow") or Path(path).is_dir()


def read_objects(path: str) -> tuple[list, str]:
    """The (line, object) of every record of a JSON or JSON-lines file, and the SHA-256 of its bytes."""
    file = resolve_data_path(path)
    if not file.is_file():
        raise InputError(f"{path}: data file not found" if not file.exists() else f"{path}: not a file")
    try:
        data = file.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise InputError(f"{path}:{line}: not UTF-8 text (byte {e.start}, column {col}: "
                         f"{data[e.start:e.start + 4]!r})") from None
    raw = list(_parse(path, text))
    if not raw:
        raise InputError(f"{path}: no records")
    return raw, hashlib.sha256(data).hexdigest()


def load_conversations(path: str, fmt: str = "auto", tags: formats.Tags | None = None) -> Records:
    """Reads and checks every record of a chat data file (JSON or JSON lines; training.data.sources reads the
    others)."""
    if other_container(path):
        from training.data.sources import load_source

        return load_source(path, fmt, preference=False)
    raw, digest = read_objects(path)
    if fmt != "auto" or tags is not None:  # the same bytes read another way are other records
        digest = hashlib.sha256(f"{fmt}:{tags}:{digest}".encode()).hexdigest()
    return Records((check_chat(path, i, line, obj, fmt, tags) for i, (line, obj) in enumerate(raw)), digest)


def load_pairs(path: str, fmt: str = "auto") -> Records:
    """Reads and checks every preference record of a DPO data file."""
    if other_container(path):
        from training.data.sources import load_source

        return load_source(path, fmt, preference=True)
    raw, digest = read_objects(path)
    return Records((check_pair(path, i, line, obj, fmt) for i, (line, obj) in enumerate(raw)),
                   hashlib.sha256(f"pairs:{fmt}:{digest}".encode()).hexdigest())


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs):
    """object_pairs_hook: a record whose key comes twice would silently keep the last one."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(f"duplicate key {k[:60]!r} in one object")
        out[k] = v
    return out


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates)


def _why(e: Exception, text: str) -> str:
    if isinstance(e, _DuplicateKey):
        return str(e)
    return _locate_hostile(text)[2]


def _parse(path: str, text: str):
    """Yields (line, object) for a JSON array file or a JSON-lines file."""
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith("["):
        yield from _parse_array(path, text, len(text) - len(stripped) + 1)
        return
    record = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, _DECODER.decode(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{lineno}: record {record}: invalid JSON at column {e.colno}: {e.msg}") from None
        except (RecursionError, ValueError) as e:  # nesting past the parser's stack, an int past int()'s limit
            raise InputError(f"{path}:{lineno}: record {record}: {_why(e, line)}") from None
        record += 1


def _parse_array(path: str, text: str, i: int):
    """The records of a JSON array, one at a time, each with the line it starts on."""
    ws = " \t\r\n"
    line, seen, record = 1, 0, 0

    def skip(k: int) -> int:
        while k < len(text) and text[k] in ws:
            k += 1
        return k

    def bad_json(pos: int, msg: str) -> InputError:
        ln = text.count("\n", 0, pos) + 1
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        return InputError(f"{path}: invalid JSON at line {ln}, column {col}: {msg} (record {record})")

    i = skip(i)
    if i < len(text) and text[i] == "]":
        i = skip(i + 1)
        if i < len(text):
            raise bad_json(i, "extra data after the array")
        return
    while True:
        line += text.count("\n", seen, i)
        seen = i
        try:
            obj, end = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg} "
                             f"(record {record})") from None
        except (RecursionError, ValueError) as e:
            ln, _, why = _locate_hostile(text[i:]) if not isinstance(e, _DuplicateKey) else (1, 0, str(e))
            raise InputError(f"{path}:{line + ln - 1}: record {record}: {why}") from None
        yield line, obj
        record += 1
        i = skip(end)
        if i < len(text) and text[i] == ",":
            i = skip(i + 1)
            continue
        if i < len(text) and text[i] == "]":
            i = skip(i + 1)
            if i < len(text):
                raise bad_json(i, "extra data after the array")
            return
        raise bad_json(i, "expected ',' or ']' after a record")


MAX_DEPTH = 200  # a chat record is 3 levels deep
MAX_INT_DIGITS = 4300  # Python's int() refuses more (sys.int_info.default_max_str_digits)


def _locate_hostile(text: str) -> tuple[int, int, str]:
    """(line, record index, problem) of the first place that nests deeper than MAX_DEPTH
    or holds a longer integer than int() takes. Only run once parsing has failed."""
    depth, line, record, in_str, esc, digits = 0, 1, 0, False, False, 0
    for ch in text:
        if ch == "\n":
            line += 1
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch.isdigit():
            digits += 1
            if digits > MAX_INT_DIGITS:
                return line, record, f"a number of more than {MAX_INT_DIGITS} digits"
            continue
        digits = 0
        if ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return line, record, f"nested more than {MAX_DEPTH} levels deep"
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 1:
            record += 1
    return line, record, "cannot be read as JSON"


def _record_id(obj, index: int) -> str:
    rid = obj.get("id") if isinstance(obj, dict) else None
    return f"#{index}" if rid is None else str(rid)[:100]


def _bad(path: str, index: int, line: int | None, obj):
    where = f"{path}:{line}" if line is not None else path
    rid = _record_id(obj, index)

    def bad(problem: str) -> InputError:
        return InputError(f"{where}: record {index} (id {rid!r}): {problem}")

    return bad


def check_chat(path: str, index: int, line: int | None, obj, fmt: str = "auto",
               tags: formats.Tags | None = None) -> Conversation:
    """One chat record checked and normalised (InputError names the file, line, record, id, turn and problem)."""
    bad = _bad(path, index, line, obj)
    if not isinstance(obj, dict):
        raise bad(f"expected a JSON object, got {type(obj).__name__}")
    try:
        messages, tools = formats.chat(obj, fmt, tags)
    except formats.BadRecord as e:
        raise bad(str(e)) from None
    if not any(m["role"] == "assistant" for m in messages):
        raise bad("no assistant turn (nothing to learn from)")
    return Conversation(index=index, id=_record_id(obj, index), messages=tuple(messages), tools=tools)


def check_pair(path: str, index: int, line: int | None, obj, fmt: str = "auto") -> PreferencePair:
    """One preference record checked and normalised into its two conversations."""
    bad = _bad(path, index, line, obj)
    if not isinstance(obj, dict):
        raise bad(f"expected a JSON object, got {type(obj).__name__}")
    try:
        pair = formats.preference(obj, fmt)
    except formats.BadRecord as e:
        raise bad(str(e)) from None
    rid, k = _record_id(obj, index), len(pair.prompt)
    return PreferencePair(index, rid, Conversation(index, rid, tuple(pair.prompt + pair.chosen), pair.tools, k),
                          Conversation(index, rid, tuple(pair.prompt + pair.rejected), pair.tools, k))
