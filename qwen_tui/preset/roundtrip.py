"""Saving an edited preset over the user's own file without losing what they wrote.

The file is read back in ruamel.yaml's round-trip mode, which keeps comments, key order, quoting, flow
mappings and number spellings (`2e-4`). Only the values that the edit changed are written into that
document: a value the edit did not touch keeps its text, even where it equals the default; a changed key
keeps its comment; a field that was left to its default and is now set is added at the end of its section.
The caller checks that the text it gets reads back as the same preset.
"""

from __future__ import annotations

import difflib
import io
import re

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

_MISSING = object()


def _merge_map(doc: CommentedMap, old: dict, new: dict, sparse: dict) -> None:
    """Writes into `doc` the keys whose value differs between `old` and `new` (full dumps of the previous and
    the edited preset at this level); `sparse` is the edited one without defaults, for what has to be added."""
    for key, value in new.items():
        before = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
        if before == value:
            continue  # untouched by the edit: the user's text stays
        if key not in doc:
            doc[key] = sparse.get(key, value) if isinstance(sparse, dict) else value
            continue
        here = doc[key]
        sub_sparse = sparse.get(key, {}) if isinstance(sparse, dict) else {}
        if isinstance(here, CommentedMap) and isinstance(value, dict):
            _merge_map(here, before if isinstance(before, dict) else {}, value, sub_sparse)
        elif isinstance(here, CommentedSeq) and isinstance(value, list):
            _merge_seq(here, before if isinstance(before, list) else [], value,
                       sub_sparse if isinstance(sub_sparse, list) else value)
        else:
            doc[key] = value  # ruamel keeps the key's end-of-line comment


def _merge_seq(doc: CommentedSeq, old: list, new: list, sparse: list) -> None:
    for i, value in enumerate(new):
        if i >= len(doc):
            doc.append(sparse[i] if i < len(sparse) else value)
            continue
        before = old[i] if i < len(old) else _MISSING
        if before == value:
            continue
        if isinstance(doc[i], CommentedMap) and isinstance(value, dict):
            _merge_map(doc[i], before if isinstance(before, dict) else {}, value,
                       sparse[i] if i < len(sparse) else value)
        else:
            doc[i] = value
    del doc[len(new):]


def guess_indent(text: str) -> tuple[int, int]:
    """(mapping indent, dash offset of a block sequence) as the file writes them; ruamel's own guess mixes the
    two up where a file indents its lists (`nodes:` then `  - host:`) but not its mappings."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    mapping = offset = None
    for a, b in zip(lines, lines[1:]):
        if not a.split(" #")[0].rstrip().endswith(":"):
            continue  # not a key that opens a block
        ia, ib = len(a) - len(a.lstrip()), len(b) - len(b.lstrip())
        if b.lstrip().startswith("- "):
            offset = ib - ia if offset is None else offset
        elif ib > ia:
            mapping = ib - ia if mapping is None else mapping
    return mapping or 2, max(offset or 0, 0)


def merged_text(original: str, old: dict, new: dict, sparse: dict) -> str | None:
    """`original` (the file's text) with the changes from `old` to `new` written in; None when the text is not
    a YAML mapping ruamel can round-trip (the caller then writes a fresh dump)."""
    try:
        doc = YAML().load(original)
    except YAMLError:
        return None
    if not isinstance(doc, CommentedMap):
        return None
    _merge_map(doc, old, new, sparse)
    y = YAML()  # round-trip
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap a long line the user wrote
    mapping, offset = guess_indent(original)
    y.indent(mapping=mapping, sequence=offset + 2, offset=offset)
    # ruamel writes None as nothing (`zero_stage:`); `null` is what safe_dump and our presets write
    y.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    out = io.StringIO()
    y.dump(doc, out)
    return keep_null_spellings(original, out.getvalue())


# `key: null` / `key: ~` / `key:` (a comment may follow): the value is YAML's null in any of its spellings
_NULL_LINE = re.compile(r"^(\s*(?:- )?[^#:]+:)\s*(?:null|Null|NULL|~)?\s*(#.*)?$")


def keep_null_spellings(original: str, dumped: str) -> str:
    """`dumped` with every line that differs from `original` only in how it spells null (`~`, `null`,
    nothing) taken back from `original`: a value the user did not touch keeps its text."""
    old, new = original.splitlines(keepends=True), dumped.splitlines(keepends=True)
    out: list[str] = []
    for op, a0, a1, b0, b1 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if op == "replace" and a1 - a0 == b1 - b0:
            for o, n in zip(old[a0:a1], new[b0:b1]):
                mo, mn = _NULL_LINE.match(o.rstrip("\n")), _NULL_LINE.match(n.rstrip("\n"))
                same = mo and mn and mo.group(1) == mn.group(1) and (mo.group(2) or "") == (mn.group(2) or "")
                out.append(o if same else n)
        else:
            out.extend(new[b0:b1])
    return "".join(out)

