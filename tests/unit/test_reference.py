"""The manual's reference is generated from the code (docs/gen_reference.py); these tests fail when something the
code declares has no entry there: a sub-command, a preset field (or one without a description), an advice or check
code (found by reading every Advice(...) and Finding(...) in qwen_tui/), a failure signature or a monitor notice.
They also fail on an entry nothing raises any more, and on a reference page that leaves a section out."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
from pathlib import Path

import pytest

from support.paths import ROOT

DOCS = ROOT / "docs"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _gen()


def raised_codes(kind: str, root: Path = ROOT) -> dict[str, list[str]]:
    """Every code qwen_tui/ gives an Advice or a Finding, read from the source: code -> where, with the level when
    the call spells it. A code that is not written as a literal (or a choice of literals) cannot be found by the
    reference, so it fails here."""
    found: dict[str, list[str]] = {}
    bad = []
    for path in sorted((root / "qwen_tui").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == kind):
                continue
            arg = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "code"), None)
            where = f"{path.relative_to(root)}:{node.lineno}"
            options = [arg.body, arg.orelse] if isinstance(arg, ast.IfExp) else [arg]
            if not all(isinstance(o, ast.Constant) and isinstance(o.value, str) for o in options):
                bad.append(where)
                continue
            for o in options:
                found.setdefault(o.value, []).append(where)
    assert not bad, f"{kind} codes not written as literals (the reference cannot find them): {bad}"
    return found


def test_every_subcommand_has_its_entry():
    from qwen_tui.cli.main import build_parser

    subs = gen.subcommands(build_parser())
    assert {"replay", "demo", "check", "estimate", "attach", "runs"} <= set(subs)  # the walk finds the parser's
    page = gen.commands_md()
    for name, sub in subs.items():
        assert f"## qwen-tui {name}\n" in page, f"qwen-tui {name} has no entry in the command reference"
        assert sub.format_usage().split()[1:3] == ["qwen-tui", name]
        for action in sub._actions:  # every option of every command is in its entry (an old spelling hides)
            for flag in ([] if action.help == argparse.SUPPRESS else action.option_strings):
                assert flag in page.split(f"## qwen-tui {name}\n")[1].split("\n## ")[0], (name, flag)


def test_every_preset_field_has_its_entry_with_a_description():
    from qwen_tui.preset.schema import Preset

    fields = gen.preset_fields()
    paths = {p.replace("[]", "") for p, _ in fields}
    # an independent walk, through pydantic's JSON schema, finds no field the generator's walk missed
    schema = Preset.model_json_schema()

    def walk(node: dict, prefix: str) -> set[str]:
        if "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
        for key in ("anyOf", "allOf"):
            for part in node.get(key, []):
                if "$ref" in part or part.get("type") == "array":
                    return walk(part, prefix)
        if node.get("type") == "array" and "$ref" in node.get("items", {}):
            return walk(node["items"], prefix)
        out = set()
        for name, sub in node.get("properties", {}).items():
            out |= {prefix + name} | walk(sub, f"{prefix}{name}.")
        return out

    assert walk(schema, "") == paths
    page = gen.preset_md()
    lacking = [p for p, f in fields if not (f.description or "").strip()]
    assert not lacking, f"preset fields without a description (Field(description=...) in the schema): {lacking}"
    for path, _ in fields:
        assert f"`{path.rpartition('.')[2]}`" in page and gen._anchor(path) in page, path
    assert "{#training}" in page and "{#cluster-nodes}" in page  # every section is a heading of its own
    # types in words a YAML writer knows, whichever way the schema spells them
    assert "`ssh_config`</span> | string or null | `null` |" in page
    assert "`method`</span> | `full` or `lora` or `qlora` | `lora` |" in page


def test_every_advice_and_check_code_has_its_entry_and_every_entry_a_raiser():
    from qwen_tui.advice.codes import ADVICE
    from qwen_tui.nodes.checks.codes import CHECKS

    for kind, table, page in (("Advice", ADVICE, gen.advice_md()), ("Finding", CHECKS, gen.checks_md())):
        raised = raised_codes(kind)
        assert len(raised) > 20, raised  # the scan reads the rules
        missing = sorted(set(raised) - set(table))
        where = "qwen_tui/advice/codes.py" if kind == "Advice" else "qwen_tui/nodes/checks/codes.py"
        assert not missing, f"{kind} codes with no entry in {where}: " + "; ".join(f"{c} ({raised[c][0]})" for c in missing)
        stale = sorted(set(table) - set(raised))
        assert not stale, f"entries no {kind} raises any more: {stale}"
        for code, doc in table.items():
            assert f"`{code}`" in page and doc.when.split()[0] in page, code
            assert doc.fix or "info" in doc.levels, f"{code}: a warning or an error needs its fix"


def test_every_failure_signature_and_notice_has_its_entry():
    from qwen_tui.cluster.failures import diagnose, signatures
    from qwen_tui.run.watch.notices import KINDS, LEVELS

    page = gen.failures_md()
    for code, pattern, cause, _fix in signatures():
        assert f"### {code}\n" in page and cause in page, code
        assert re.compile(pattern, re.IGNORECASE)  # the page shows a pattern that is one
    assert diagnose("RuntimeError: CUDA out of memory. Tried to allocate").code in page  # the list is the live one
    assert set(KINDS) == set(LEVELS) and all(f"`{k}`" in gen.notices_md() for k in KINDS)


def test_the_pages_hold_every_section_and_the_generator_renders_each():
    marked = set()
    for page in DOCS.rglob("*.md"):
        marked |= set(re.findall(r"<!-- generated: ([a-z-]+) -->", page.read_text(encoding="utf-8")))
    assert marked == set(gen.SECTIONS), "each generated section appears on a page of the manual, once at least"
    with pytest.raises(KeyError, match="no generated section"):
        gen.render("nothing")
    assert "--model_name_or_path" in gen.worker_md()


def test_a_code_the_reference_cannot_find_fails_the_scan(tmp_path):
    """The scan is no formality: a rule whose code is built at run time is refused, and a new literal code shows up
    (on a scratch copy of qwen_tui/, the real tree untouched)."""
    import shutil

    shutil.copytree(ROOT / "qwen_tui", tmp_path / "qwen_tui", ignore=shutil.ignore_patterns("__pycache__"))
    rules = tmp_path / "qwen_tui" / "advice" / "rules.py"
    rules.write_text(rules.read_text(encoding="utf-8") + '\n\ndef _x(kind):\n    return Advice("error", "NEW_CODE", "m")'
                     '\n\n\ndef _y(kind):\n    return Advice("error", f"{kind}_CODE", "m")\n', encoding="utf-8")
    with pytest.raises(AssertionError, match=r"not written as literals.*rules\.py"):
        raised_codes("Advice", tmp_path)
    rules.write_text(rules.read_text(encoding="utf-8").replace('f"{kind}_CODE"', '"OTHER_CODE"'), encoding="utf-8")
    assert {"NEW_CODE", "OTHER_CODE"} <= set(raised_codes("Advice", tmp_path))


def test_the_site_config_names_every_page():
    """mkdocs.yml's nav holds every page under docs/ (a page left out of it is a page nobody finds)."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages and all(f": {p}\n" in nav for p in pages), sorted(p for p in pages if f": {p}\n" not in nav)
    assert Path(ROOT / "docs" / "hooks.py").exists()
