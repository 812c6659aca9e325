"""The manual's reference, generated from the code so that it cannot drift from it.

Each section renders one thing the code declares, found by walking it, with no list of names kept here:

- commands:  every sub-command of `qwen-tui` (qwen_tui.cli.main.build_parser), its `--help` as a terminal of
             100 columns prints it;
- preset:    every field of the preset (qwen_tui.preset.schema.Preset), section by section, with its type, default,
             bounds and description, walked through the pydantic models, so a new section appears by itself;
- advice:    every advice code (qwen_tui.advice.codes.ADVICE), with its level, when it is raised and its fix;
- checks:    every code of the node checks (qwen_tui.nodes.checks.codes.CHECKS), the same way;
- failures:  every failure signature read in a node's log (qwen_tui.cluster.failures), its cause and its fix;
- notices:   every notice of the run monitor (qwen_tui.run.watch.notices.KINDS);
- worker:    the worker's `python -m training.finetune --help` (training.args.build_parser).

docs/hooks.py puts a section where a page says `<!-- generated: NAME -->` while MkDocs builds the site;
`python docs/gen_reference.py NAME` prints one. tests/unit/test_reference.py checks that every sub-command, preset
field and code has its entry.
"""

from __future__ import annotations

import argparse
import os
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout's qwen_tui and training, however this file is run
    sys.path.insert(0, str(ROOT))

HELP_COLUMNS = 100  # the width the reference's --help texts are rendered at
UNIONS = (Union, types.UnionType)  # Optional[X] and X | None alike


@contextmanager
def _columns(n: int) -> Iterator[None]:
    """argparse wraps its help to $COLUMNS: a fixed width gives the same page on every machine."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(n)
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def _cell(text: str) -> str:
    """Text for a markdown table cell: one line, its pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ---------------------------------------------------------------- commands

def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's sub-commands by name, in the order `--help` lists them (aliases left out)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = [a.dest for a in action._choices_actions]
            return {name: action.choices[name] for name in listed}
    return {}


def commands_md() -> str:
    from qwen_tui.cli.main import build_parser

    parser = build_parser()
    with _columns(HELP_COLUMNS):
        out = ["Every command prints this with `--help`; `qwen-tui COMMAND --help` the command's own.", "",
               "```text", parser.format_help().rstrip(), "```", ""]
        for name, sub in subcommands(parser).items():
            out += [f"## qwen-tui {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def worker_md() -> str:
    from training.args import build_parser

    with _columns(HELP_COLUMNS):
        text = build_parser().format_help().rstrip()
    return "\n".join(["```text", text, "```", ""])


# ---------------------------------------------------------------- preset

def _is_model(tp: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _inner_model(tp: Any) -> tuple[Any, bool]:
    """The pydantic model a field holds (directly, optionally or as a list of them) and whether it is a list."""
    if _is_model(tp):
        return tp, False
    origin, args = get_origin(tp), get_args(tp)
    if origin is list and args and _is_model(args[0]):
        return args[0], True
    if origin in UNIONS:
        for a in args:
            model, many = _inner_model(a)
            if model is not None:
                return model, many
    return None, False


def type_name(tp: Any) -> str:
    """A field's type in words a YAML writer knows."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return " or ".join(f"`{a}`" if a is not None else "null" for a in args)
    if origin in UNIONS:
        return " or ".join(type_name(a) for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}" if args else "map"
    if _is_model(tp):
        return "section"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp, getattr(tp, "__name__", str(tp)))


def _bounds(field: Any) -> str:
    """The bounds pydantic enforces on a field, in words."""
    words = []
    for m in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(m, attr, None)
            if value is not None:
                words.append(f"{sign} {value:,}" if isinstance(value, int) else f"{sign} {value}")
        least = getattr(m, "min_length", None)
        if least:
            words.append("not empty" if least == 1 else f"at least {least} long")
    return ", ".join(words)


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is PydanticUndefined:
        return "required"
    if _is_model(type(value)):
        return "(its fields' defaults)"
    import json

    if isinstance(value, str):
        return f"`{value}`"
    return f"`{json.dumps(value)}`"


def preset_fields() -> list[tuple[str, Any]]:
    """Every field of the preset as (dotted path, pydantic FieldInfo), sections' own fields after them; a list of
    sections (`cluster.nodes`) is written `cluster.nodes[]`."""
    from qwen_tui.preset.schema import Preset

    out: list[tuple[str, Any]] = []

    def walk(model: Any, prefix: str) -> None:
        for name, field in model.model_fields.items():
            path = f"{prefix}{name}"
            out.append((path, field))
            inner, many = _inner_model(field.annotation)
            if inner is not None:
                walk(inner, f"{path}{'[]' if many else ''}.")

    walk(Preset, "")
    return out


def preset_md() -> str:
    fields = preset_fields()
    sections: dict[str, list[tuple[str, Any]]] = {"": []}
    for path, field in fields:
        parent = path.rpartition(".")[0]
        sections.setdefault(parent, []).append((path, field))
    out = []
    for parent, rows in sections.items():
        if not rows:
            continue
        if parent:
            owner = next(f for p, f in fields if p == parent.removesuffix("[]"))
            what = (owner.description or "").rstrip(".")
            many = " A list: each item has these fields." if parent.endswith("[]") else ""
            out += [f"## {parent} {{#{_anchor(parent)}}}", "", f"{what[:1].upper()}{what[1:]}.{many}", ""]
        else:
            out += ["## The top level {#top}", "", "The preset's own fields and its sections.", ""]
        out += ["| field | type | default | description |", "| --- | --- | --- | --- |"]
        for path, field in rows:
            name = path.rpartition(".")[2]
            inner, many = _inner_model(field.annotation)
            if inner is not None:
                typ = f"{'list of ' if many else ''}[section](#{_anchor(path + ('[]' if many else ''))})"
            else:
                typ = type_name(field.annotation)
            bounds = _bounds(field)
            desc = (field.description or "") + (f" ({bounds})" if bounds else "")
            # a section's anchor is its heading's; a field's is its row's
            label = f"`{name}`" if inner is not None else f"<span id=\"{_anchor(path)}\">`{name}`</span>"
            out.append(f"| {label} | {_cell(typ)} | {_cell(_default(field))} | {_cell(desc)} |")
        out.append("")
    return "\n".join(out)


def _anchor(path: str) -> str:
    """A field's or section's anchor on the preset page: `training.restarts` -> training-restarts."""
    return path.replace("[]", "").replace(".", "-")


# ---------------------------------------------------------------- codes

def _codes_table(codes: dict[str, Any]) -> str:
    out = ["| code | level | when | fix |", "| --- | --- | --- | --- |"]
    for code, doc in codes.items():
        out.append(f"| <span id=\"{code}\">`{code}`</span> | {_cell(doc.levels)} | {_cell(doc.when)} | "
                   f"{_cell(doc.fix) or '-'} |")
    return "\n".join(out) + "\n"


def advice_md() -> str:
    from qwen_tui.advice.codes import ADVICE

    return _codes_table(ADVICE)


def checks_md() -> str:
    from qwen_tui.nodes.checks.codes import CHECKS

    return _codes_table(CHECKS)


def notices_md() -> str:
    from qwen_tui.run.watch.notices import KINDS

    return _codes_table(KINDS)


def failures_md() -> str:
    from qwen_tui.cluster.failures import CONSEQUENTIAL, signatures

    out = []
    for code, pattern, cause, fix in signatures():
        out += [f"### {code}", "", f"**Cause**: {cause}.", "", f"**Fix**: {fix.replace('{py}', 'PYTHON')}.", ""]
        if code in CONSEQUENTIAL:
            out += ["Often a consequence of another node's failure: the node whose own log shows a cause of its own "
                    "is the one to blame, and qwen-tui names that one first.", ""]
        out += ["Log lines it matches (a regular expression):", "", "```text", pattern, "```", ""]
    return "\n".join(out)


SECTIONS: dict[str, Callable[[], str]] = {
    "commands": commands_md, "worker": worker_md, "preset": preset_md, "advice": advice_md, "checks": checks_md,
    "failures": failures_md, "notices": notices_md,
}


def render(name: str) -> str:
    if name not in SECTIONS:
        raise KeyError(f"no generated section {name!r} (there are: {', '.join(SECTIONS)})")
    return SECTIONS[name]()


if __name__ == "__main__":
    names = sys.argv[1:] or list(SECTIONS)
    for n in names:
        sys.stdout.write(render(n) + "\n")
