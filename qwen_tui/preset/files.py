"""A preset's file: read it, write it.

`load_preset(path)` parses with a safe loader into a validated Preset (schema.py) and
turns every problem into a `PresetError` whose lines read
`presets/x.yaml:14 training.zero_stage: must be 2 or 3, got 4`. Loading never
writes. `save_preset(preset, path)` writes atomically (temp file in the same
directory, fsync, rename); over an existing preset it changes only the edited values and
keeps the user's comments, order and explicit values (ruamel.yaml round trip); a new file
gets a header comment with the command that runs it.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .schema import Preset
from .yaml_io import PresetError

# ---------------------------------------------------------------- loading

def _line_of(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest YAML node along `loc` (a pydantic error location)."""
    node, line = root, None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == str(part):
                    nxt, line = v, k.start_mark.line + 1
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            node = None
    if node is not None:
        line = node.start_mark.line + 1
    return line


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at `loc` (to suggest near misses)."""
    model: Any = Preset
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        for cand in (ann, *getattr(ann, "__args__", ())):
            inner = getattr(cand, "__args__", (cand,))
            found = next((c for c in (cand, *inner) if isinstance(c, type) and issubclass(c, BaseModel)), None)
            if found:
                model = found
                break
        else:
            return None
    return model


def _describe(err: Mapping[str, Any]) -> str:
    loc = err["loc"]
    if err["type"] == "extra_forbidden":
        model = _model_at(loc)
        hint = ""
        if model is not None:
            near = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
            if near:
                hint = f" (did you mean {near[0]!r}?)"
        return f"unknown key{hint}"
    if err["type"] == "missing":
        return "is required"
    msg = err["msg"]
    msg = msg.removeprefix("Value error, ")
    if "input" in err and err["type"] not in ("value_error",) and not isinstance(err["input"], (dict, list)):
        msg = f"{msg}, got {err['input']!r}"
    return msg


def _fmt_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse_preset(text: str, source: str = "<preset>") -> Preset:
    """Validate YAML text. Raises PresetError with `source:line field: problem` lines."""
    from .yaml_io import load_yaml

    try:
        root, data = load_yaml(text, source)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            line = mark.line + 1
        elif isinstance(e, yaml.reader.ReaderError):  # a character YAML does not allow (control, BOM misuse)
            line = text.count("\n", 0, e.position) + 1
        else:
            line = 1
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if isinstance(e, yaml.reader.ReaderError):
            problem = f"character #x{e.character:04x} is not allowed in YAML"
        raise PresetError([f"{source}:{line} (text): not valid YAML: {problem}"]) from None
    if not isinstance(data, dict):
        raise PresetError([f"{source}:1 (top level): must be a mapping with cluster and training, got {type(data).__name__}"])
    try:
        return Preset.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = tuple(err["loc"])
            # model-level validators put the field path into the message
            if not loc and ":" in err["msg"]:
                path, _, rest = err["msg"].removeprefix("Value error, ").partition(": ")
                loc_guess = tuple(int(p) if p.isdigit() else p for p in path.split("."))
                line = _line_of(root, loc_guess)
                lines.append(f"{source}:{line or 1} {path}: {rest}")
                continue
            line = _line_of(root, loc)
            lines.append(f"{source}:{line or 1} {_fmt_loc(loc)}: {_describe(err)}")
        raise PresetError(lines) from None


def load_preset(path: str | os.PathLike[str]) -> Preset:
    """Read and validate a preset file. Never writes anything."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise PresetError([f"{p}: no such preset file"]) from None
    except OSError as e:
        raise PresetError([f"{p}: cannot read: {e.strerror or e}"]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise PresetError([f"{p}:{line} (text): not UTF-8 (byte {e.start}: {data[e.start:e.start + 4]!r})"]) from None
    return parse_preset(text, str(p))


# ---------------------------------------------------------------- saving

def header_for(path: str | os.PathLike[str], preset: Preset) -> str:
    title = preset.name or Path(path).stem
    lines = [f"# qwen-tui preset: {title}"]
    if preset.description:
        lines += [f"# {ln}" for ln in preset.description.splitlines()]
    lines += [f"# Run it:   qwen-tui replay {path}", f"# Check it: qwen-tui check {path}", ""]
    return "\n".join(lines)


def dump_preset(preset: Preset) -> str:
    """YAML for a preset: defaults left out except the fields a reader needs to see."""
    data = preset.model_dump(mode="json", exclude_defaults=True)
    data = {"version": preset.version, **data}
    data.setdefault("training", {})
    for key in ("method", "zero_stage"):  # always visible: they decide the run
        data["training"].setdefault(key, getattr(preset.training, key))
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


def save_preset(preset: Preset, path: str | os.PathLike[str], header: str | None = None,
                mode: int = 0o644) -> Path:
    """Write atomically: a reader sees the old file or the new one, never half of one.

    Over an existing valid preset only the values that differ from it are written into the
    file's own text (comments, order, explicit defaults and spellings survive). Otherwise the
    preset is dumped fresh: an existing header comment (the lines starting with `#` at the
    top) is kept unless `header` is given; a new file gets one with the command that runs it.
    A path that is a symbolic link updates the link's target (the link stays a link). A new
    file gets `mode`; an existing one keeps its mode.
    """
    p = Path(path)
    if p.is_symlink():
        p = Path(os.path.realpath(p))
    text = _edited_text(preset, p) if header is None else None
    if text is not None:
        _write_atomic(p, text, mode)
        return p
    body = dump_preset(preset)
    parse_preset(body, str(p))  # never write what we could not read back
    if header is None:
        header = ""
        if p.exists():
            old = p.read_text(encoding="utf-8").splitlines(keepends=True)
            keep = []
            for ln in old:
                if not ln.startswith("#"):
                    break
                keep.append(ln)
            header = "".join(keep)
        if not header:
            header = header_for(p, preset)
    if header and not header.endswith("\n"):
        header += "\n"
    _write_atomic(p, header + body, mode)
    return p


def _edited_text(preset: Preset, p: Path) -> str | None:
    """The user's existing file with only the edited values changed (comments, order and explicit values kept;
    qwen_tui.preset.roundtrip), or None where there is no valid file to start from."""
    from .roundtrip import merged_text

    try:
        original = p.read_text(encoding="utf-8")
        previous = parse_preset(original, str(p))
    except (OSError, UnicodeDecodeError, PresetError):
        return None
    text = merged_text(original, previous.model_dump(mode="json"), preset.model_dump(mode="json"),
                       preset.model_dump(mode="json", exclude_defaults=True))
    if text is None:
        return None
    try:
        again = parse_preset(text, str(p))
    except PresetError:
        return None
    # never write what does not read back as the preset being saved
    return text if again.model_dump(mode="json") == preset.model_dump(mode="json") else None


def _write_atomic(p: Path, text: str, mode: int = 0o644) -> None:
    """A new file gets `mode`, an existing one keeps its own (qwen_tui.base.atomic: never half written, never through a
    planted temp-file link)."""
    from ..base.atomic import write_text_atomic

    p.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(p, text, p.stat().st_mode & 0o777 if p.exists() else mode)
