"""Reading and checking chat records (pure Python: no torch, no transformers).

Two formats, one record per JSON object, in a JSON array file or a JSON-lines file:

    Qwen:    {"id": "x", "conversations": [{"from": "system"|"user"|"assistant", "value": "..."}]}
    OpenAI:  {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}]}

Both become a Conversation with OpenAI-style messages, the form chat templates
take. Every record is checked before training starts: a bad one raises
InputError naming the file, the record index and id (and the line for
JSON lines), and what is wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from training.errors import InputError

BUILTIN_DATA = {"builtin:demo-chat": Path(__file__).with_name("demo_data") / "demo_chat.jsonl"}
ROLES = {"system": "system", "user": "user", "assistant": "assistant",
         # ShareGPT spellings, common in data sets that otherwise follow Qwen's format
         "human": "user", "gpt": "assistant"}


@dataclass(frozen=True)
class Conversation:
    index: int  # position in the file, 0-based
    id: str  # the record's own id, or "#index" when it has none
    messages: tuple  # ({"role": ..., "content": ...}, ...)


def resolve_data_path(path: str) -> Path:
    if path.startswith("builtin:"):
        if path not in BUILTIN_DATA:
            raise InputError(f"unknown built-in data set {path!r}; known: {', '.join(sorted(BUILTIN_DATA))}")
        return BUILTIN_DATA[path]
    return Path(path)


def load_conversations(path: str) -> list[Conversation]:
    """Reads and checks every record of a data file."""
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
    return [_check_record(path, i, line, obj) for i, (line, obj) in enumerate(raw)]


def _parse(path: str, text: str):
    """Yields (line or None, object) for a JSON array file or a JSON-lines file."""
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: invalid JSON at line {_array_line(text, stripped, e)}, column {e.colno}: {e.msg}") from None
        except (RecursionError, ValueError):
            line, record, why = _locate_hostile(text)
            raise InputError(f"{path}:{line}: record {record}: {why}") from None
        for obj in data:
            yield None, obj
        return
    record = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{lineno}: record {record}: invalid JSON at column {e.colno}: {e.msg}") from None
        except (RecursionError, ValueError):  # nesting past the parser's stack, an int past int()'s digit limit
            raise InputError(f"{path}:{lineno}: record {record}: {_locate_hostile(line)[2]}") from None
        record += 1


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


def _array_line(text: str, stripped: str, e: json.JSONDecodeError) -> int:
    # json counts lines in the stripped text; add the lines that the strip removed.
    return e.lineno + text[: len(text) - len(stripped)].count("\n")


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _check_record(path: str, index: int, line: int | None, obj) -> Conversation:
    rid = obj.get("id") if isinstance(obj, dict) else None
    rid = f"#{index}" if rid is None else str(rid)[:100]
    where = f"{path}:{line}" if line is not None else path

    def bad(problem: str) -> InputError:
        return InputError(f"{where}: record {index} (id {rid!r}): {problem}")

    if not isinstance(obj, dict):
        raise bad(f"expected a JSON object, got {type(obj).__name__}")
    if "conversations" in obj:
        turns, role_key, text_key, field = obj["conversations"], "from", "value", "conversations"
    elif "messages" in obj:
        turns, role_key, text_key, field = obj["messages"], "role", "content", "messages"
    else:
        raise bad("has neither 'conversations' (Qwen format) nor 'messages' (OpenAI format)")
    if not isinstance(turns, list):
        raise bad(f"'{field}' must be a list, got {type(turns).__name__}")
    if not turns:
        raise bad(f"empty conversation ('{field}' is [])")
    messages = []
    for t, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise bad(f"{field}[{t}] must be an object, got {type(turn).__name__}")
        if role_key not in turn:
            raise bad(f"{field}[{t}] has no '{role_key}'")
        role = ROLES.get(turn[role_key]) if isinstance(turn[role_key], str) else None
        if role is None:
            raise bad(f"{field}[{t}] has unknown role {turn[role_key]!r} (expected system, user or assistant)")
        content = turn.get(text_key)
        if not isinstance(content, str):
            raise bad(f"{field}[{t}].{text_key} must be a string, got {type(content).__name__}")
        if not _encodable(content):
            raise bad(f"{field}[{t}].{text_key} holds a lone surrogate (an unpaired \\ud800-\\udfff escape): "
                      "not text a tokenizer can read")
        if role == "assistant" and not content.strip():
            raise bad(f"{field}[{t}] is an empty assistant reply")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise bad("no assistant turn (nothing to learn from)")
    return Conversation(index=index, id=rid, messages=tuple(messages))

