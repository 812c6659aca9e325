"""The house plan's floors (/work/shared/ARCHITECTURE.md, "Floors"), read from the code:
every import of every module under qwen_tui/ (lazy ones inside functions and
TYPE_CHECKING ones included) points to its own floor or one below, and no modules
import each other in a circle. A new module must be given a floor here: that is
the moment to decide where it lives.

    5  faces      cli*.py, ui/ (Textual only)
    4  run/       launch API, launcher, live view, exports, run directories
    3  nodes/     transports, keys, probe, network checks; advice.py
    2  plan.py, estimate.py
    1  preset.py, facts.py, modelspec.py, failures.py, shell.py (quoting), ...
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "qwen_tui"

# module (without the "qwen_tui." prefix; "" is the package itself) -> floor; first match wins
FLOORS: list[tuple[str, int]] = [
    ("", 0), ("base", 0), ("base.*", 0), ("model", 1), ("model.*", 1),
    ("preset", 2), ("preset.*", 2), ("cluster", 2), ("cluster.*", 2),
    ("plan", 3), ("plan.*", 3), ("nodes", 4), ("nodes.*", 4), ("advice", 5), ("advice.*", 5),
    ("run", 6), ("run.*", 6), ("wizard", 7), ("wizard.*", 7),
    ("cli", 8), ("cli.*", 8), ("__main__", 8), ("ui", 8), ("ui.*", 8),
]



def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = list(f.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def floor(mod: str) -> int:
    for pat, n in FLOORS:
        if fnmatch.fnmatchcase(mod, pat):
            return n
    raise AssertionError(f"qwen_tui.{mod} has no floor: add it to FLOORS in {__file__}")


def imports(mod: str, path: Path, known: set[str]) -> set[str]:
    """The qwen_tui modules `mod` imports (relative to the package, "" for qwen_tui itself)."""
    is_pkg = path.name == "__init__.py"
    here = ["qwen_tui"] + (mod.split(".") if mod else [])
    if not is_pkg:
        here = here[:-1]
    out: set[str] = set()

    def add(full: str) -> None:
        if full == "qwen_tui" or full.startswith("qwen_tui."):
            out.add(full.removeprefix("qwen_tui").lstrip("."))

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            base = (".".join(here[:len(here) - (node.level - 1)]) if node.level else "")
            target = ".".join(p for p in (base, node.module or "") if p)
            for a in node.names:  # `from . import core` imports the module qwen_tui.ui.core
                sub = f"{target}.{a.name}".removeprefix("qwen_tui").lstrip(".")
                if target.startswith("qwen_tui") and sub in known:
                    out.add(sub)
                else:
                    add(target)
    out.discard(mod)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports(m, p, set(mods)) for m, p in mods.items()}


def circles(g: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_floor():
    for m in modules():
        floor(m)


def test_imports_only_point_down():
    up = {(m, d) for m, deps in graph().items() for d in deps if floor(d) > floor(m)}
    assert up == set(), "imports that run up a floor: " + ", ".join(
        f"qwen_tui.{m} (floor {floor(m)}) -> qwen_tui.{d} (floor {floor(d)})" for m, d in sorted(up))


def test_no_circles():
    """No modules import each other in a circle, lazy imports included (the screens type-check the
    App through ui/wizard.py's Protocol instead of importing app.py, which opens them)."""
    found = circles(graph())
    assert found == [], "modules that import each other in a circle: " + "; ".join(
        " <-> ".join(sorted(c)) for c in found)


def test_the_wizard_state_and_the_launch_api_are_core():
    """The wizard's model and the launch API sit below the faces: nothing under them imports ui/ or a cli."""
    g = graph()
    for m in ("wizard.state", "run.api", "run.live", "nodes.hostlists", "advice.report"):
        assert m in g, f"qwen_tui.{m} is gone"
        assert not {d for d in g[m] if d.startswith("ui") or d.startswith("cli")}, (m, g[m])


# What talks to the nodes: a screen reaches these through the launch API (run.api), as the CLI does,
# so the wizard and the commands connect, probe, check, sync and set up keys the same way.
NODE_ACTIONS = {"nodes.checks", "nodes.connect", "nodes.probe", "nodes.keys", "nodes.sync", "nodes.netcheck"}


def test_screens_talk_to_the_nodes_only_through_the_launch_api():
    g = graph()
    screens = [m for m in g if m.startswith("ui.screens.")]
    assert {"ui.screens.nodes", "ui.screens.network", "ui.screens.ssh"} <= set(screens)
    direct = {(m, d) for m in screens for d in g[m] if d in NODE_ACTIONS}
    assert direct == set(), "screens that call the nodes directly (add a function to run/api.py): " + ", ".join(
        f"qwen_tui.{m} -> qwen_tui.{d}" for m, d in sorted(direct))
    assert all("run.api" in g[m] for m in ("ui.screens.nodes", "ui.screens.network", "ui.screens.ssh"))


def test_ui_holds_only_textual_code():
    """Pure code belongs to its core room, not under ui/ (a module there draws with Textual or rich)."""
    pure = set()
    for m, p in modules().items():
        if m.startswith("ui.") and not p.name == "__init__.py":
            names = {a.name.split(".")[0] for n in ast.walk(ast.parse(p.read_text()))
                     if isinstance(n, ast.Import) for a in n.names}
            names |= {(n.module or "").split(".")[0] for n in ast.walk(ast.parse(p.read_text()))
                      if isinstance(n, ast.ImportFrom) and not n.level}
            if not names & {"textual", "rich"}:  # rich: drawing for the screen (bars, charts)
                pure.add(m)
    assert pure == set(), f"pure modules under ui/ (move them to their core room): {sorted(pure)}"


def test_the_checker_sees_an_upward_import_and_a_circle():
    """The rules above catch what they claim to (on a made-up graph)."""
    g = {"plan.launch": {"nodes.transport"}, "nodes.transport": {"nodes.jobs"}, "nodes.jobs": {"nodes.transport"}}
    assert [(m, d) for m, ds in g.items() for d in ds if floor(d) > floor(m)] == [("plan.launch", "nodes.transport")]
    assert circles(g) == [{"nodes.transport", "nodes.jobs"}]
