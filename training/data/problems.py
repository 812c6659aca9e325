"""Every problem of a data file in one pass: what `qwen-tui data` (training.datapreview) reports when the records do not
load, so that a file with three kinds of mistakes takes one run to fix, not three.

The worker itself stops at the first bad record (training.data.records.load_conversations: nothing trains on a file
that is partly wrong). Here every record is read and checked with the same rules (records.check_chat), and the
problems are grouped by kind: each kind with its count and its first few records (index, id, line).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from training.data.records import check_chat, resolve_data_path
from training.runtime.errors import InputError

FIRST = 3  # records shown per kind


@dataclass
class Kind:
    kind: str  # the problem with its particulars generalised: "conversations[n] has unknown role '…'"
    count: int = 0
    first: list[str] = field(default_factory=list)  # "line 4, record 3 (id 'x'): the problem as found"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "count": self.count, "first": list(self.first)}


def _kind(problem: str) -> str:
    k = re.sub(r"\[\d+\]", "[n]", problem)
    k = re.sub(r"'[^']*'", "'…'", k)
    k = re.sub(r"\b(at|column|line|byte) \d+", r"\1 n", k)
    return k


def scan(path: str) -> tuple[int, list[Kind]]:
    """(records read, the kinds of problem found, in the order first met). Raises InputError only for a file that
    cannot be read at all."""
    file = resolve_data_path(path)
    try:
        data = file.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    kinds: dict[str, Kind] = {}

    def add(problem: str, where: str) -> None:
        k = kinds.setdefault(_kind(problem), Kind(_kind(problem)))
        k.count += 1
        if len(k.first) < FIRST:
            k.first.append(f"{where}: {problem}")

    text = data.decode("utf-8", errors="replace")
    if "\ufffd" in text and b"\xef\xbf\xbd" not in data:
        bad = data.decode("utf-8", errors="replace").split("\n")
        line = next(i for i, ln in enumerate(bad, 1) if "\ufffd" in ln)
        add("not UTF-8 text", f"line {line}")
    records = 0
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except ValueError as e:
            add(f"invalid JSON: {e.msg}", f"line {e.lineno}, column {e.colno}")
            return records, list(kinds.values())
        for i, obj in enumerate(items):
            records += 1
            _check(path, i, None, obj, add)
        return records, list(kinds.values())
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        i = records
        records += 1
        try:
            obj = json.loads(line)
        except ValueError as e:
            add(f"invalid JSON: {e.msg}", f"line {lineno}, record {i}")
            continue
        _check(path, i, lineno, obj, add)
    return records, list(kinds.values())


def _check(path: str, index: int, line, obj, add) -> None:
    try:
        check_chat(path, index, line, obj)
    except InputError as e:
        msg = str(e)
        head, sep, problem = msg.partition("): ")
        where = head.split(": ", 1)[1] + ")" if sep and ": " in head else f"record {index}"
        if line is not None:
            where = f"line {line}, {where}"
        add(problem if sep else msg, where)


def report(path: str) -> str | None:
    """Every problem of the file as one message (None when it has none): a line per kind with its count, then its
    first records."""
    records, kinds = scan(path)
    if not kinds:
        return None
    bad = sum(k.count for k in kinds)
    out = [f"{path}: {bad} problem(s) in {records} record(s), {len(kinds)} kind(s); nothing trains until every one is "
           "fixed:"]
    for k in kinds:
        out.append(f"  {k.count} x {k.kind}")
        out += [f"      {f}" for f in k.first]
        if k.count > len(k.first):
            out.append(f"      ... and {k.count - len(k.first)} more")
    return "\n".join(out)
