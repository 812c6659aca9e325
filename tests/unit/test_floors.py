"""The floors (docs/architecture.md), read from the code: the import-linter contracts in pyproject.toml hold
(each package of qwen_tui/ imports only those below it, no circles, no Textual below the faces, no torch in the
tool, training/ never imports qwen_tui, the wizard acts on the nodes only through the launch API, the rooms of
run/ and nodes/ import down, advice/ reaches no node), and they fail when someone breaks them."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

from support.paths import ROOT

PKG = ROOT / "qwen_tui"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the tree at `cwd` (its pyproject.toml), with that tree first on the path."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)})


def test_the_import_contracts_hold():
    res = lint_imports(ROOT)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "10 kept, 0 broken" in res.stdout, res.stdout[-2000:]


def test_breaking_the_floors_breaks_the_contracts(tmp_path):
    """A scratch copy with an upward import, a circle, Textual in the core, the worker importing the tool, a screen
    reaching a node, rooms of run/ and nodes/ reaching up and the advice reaching a node: lint-imports fails and
    names each broken contract (and keeps the rest)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for tree in ("qwen_tui", "training"):
        shutil.copytree(ROOT / tree, tmp_path / tree, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)

    def append(rel: str, line: str) -> None:
        p = tmp_path / rel
        p.write_text(p.read_text() + "\n" + line + "\n")

    # upward, and lazy (inside a function: it counts as well): the plan reaching for the launch
    append("qwen_tui/plan/outputs.py", "def _reach():\n    from qwen_tui.run import api")
    append("qwen_tui/base/redact.py", "from qwen_tui.base import atomic")
    append("qwen_tui/base/atomic.py", "from qwen_tui.base import redact  # a circle inside base/")
    append("qwen_tui/model/spec.py", "import textual")
    append("training/runtime/errors.py", "import qwen_tui.base.shell")
    append("training/data/records.py", "def _up():\n    from training import recipe")
    # a screen choosing node 0's transport itself, as the Training screen once did
    append("qwen_tui/ui/screens/training.py",
           "def _reach_node():\n    from qwen_tui.nodes.transport.local import LocalTransport")
    # the watch relaunching a run itself, a transport that runs the checks, the advice counting data on a node
    append("qwen_tui/run/watch/health.py", "def _relaunch():\n    from qwen_tui.run.recovery import restarts")
    append("qwen_tui/nodes/transport/ssh.py", "def _check():\n    from qwen_tui.nodes.checks import probe")
    append("qwen_tui/advice/datapreview.py",
           "def _count():\n    from qwen_tui.nodes.transport.protocol import Transport")

    res = lint_imports(tmp_path)
    out = " ".join(res.stdout.split())
    assert res.returncode != 0, out[-3000:]
    for broken in ("qwen_tui's floors: imports point down BROKEN",
                   "no modules or packages of qwen_tui import each other in a circle BROKEN",
                   "the core draws nothing: no Textual below the faces BROKEN",
                   "the worker stands alone: training/ never imports qwen_tui BROKEN",
                   "the wizard reaches the nodes only through the launch API (run.api), as the commands do BROKEN",
                   "training: programs > recipe > fast, checkpoints > model > data > runtime BROKEN",
                   "run: slurm > api > follow > events, recovery, export, tools > launcher > culprit > watch > "
                   "run directory BROKEN",
                   "nodes: keys, sync > connect, checks > slurm, hostlists > transport > hubmodel, jobs > programs, "
                   "results BROKEN",
                   "advice does no node I/O: no transport, connection or SLURM call BROKEN"):
        assert broken in out, out[-3000:]
    assert "qwen_tui.plan.outputs -> qwen_tui.run.api" in out, out[-3000:]
    assert "qwen_tui.ui.screens.training -> qwen_tui.nodes.transport.local" in out, out[-3000:]
    for room, up, chain in (("qwen_tui.run.watch", "qwen_tui.run.recovery", "health -> qwen_tui.run.recovery.restarts"),
                            ("qwen_tui.nodes.transport", "qwen_tui.nodes.checks", "ssh -> qwen_tui.nodes.checks.probe"),
                            ("qwen_tui.advice", "qwen_tui.nodes.transport",
                             "datapreview -> qwen_tui.nodes.transport.protocol")):
        assert f"{room} is not allowed to import {up}: - {room}.{chain}" in out, out[-3000:]
    assert "1 kept, 9 broken" in out, out[-3000:]


def test_screens_talk_to_the_nodes_through_the_launch_api():
    """The contract forbids ui/ to import what talks to the nodes; here: the modules that act on the nodes do
    import the launch API (so the contract is not kept by modules that stopped acting)."""
    g = grimp.build_graph("qwen_tui", cache_dir=None)
    for screen in ("qwen_tui.ui.screens.nodes", "qwen_tui.ui.screens.network", "qwen_tui.ui.screens.ssh",
                   "qwen_tui.ui.screens.training", "qwen_tui.ui.launch_guard"):
        assert g.direct_import_exists(importer=screen, imported="qwen_tui.run.api"), screen


def test_ui_holds_only_textual_code():
    """Pure code belongs to its core package, not under ui/ (a module there draws with Textual or rich)."""
    pure = set()
    for p in sorted((PKG / "ui").rglob("*.py")):
        if p.name == "__init__.py":
            continue
        tree = ast.parse(p.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        if not names & {"textual", "rich"}:  # rich: drawing for the screen (bars, charts)
            pure.add(str(p.relative_to(PKG)))
    assert pure == set(), f"pure modules under ui/ (move them to their core package): {sorted(pure)}"


def test_the_top_of_qwen_tui_holds_packages_only():
    """Each noun of the flow is a folder; a new module goes into the package of what it produces."""
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert loose == [], f"modules at the top of qwen_tui/ (give each its package): {loose}"
    assert all((d / "__init__.py").is_file() for d in PKG.iterdir() if d.is_dir() and d.name not in (
        "__pycache__", "presets")), "a folder of qwen_tui/ without __init__.py"


def test_every_package_is_a_small_room_that_maps_its_files():
    """No package of qwen_tui/ holds more than 12 modules at its top level (a bigger one gets rooms inside), and
    each room of run/ and nodes/, and those two themselves, name every module and room they hold in their
    __init__'s docstring: the map a newcomer reads first."""
    for init in sorted(PKG.rglob("__init__.py")):
        pkg = init.parent
        mods = sorted(p.name for p in pkg.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
        assert len(mods) <= 12, f"{pkg.relative_to(PKG)} holds {len(mods)} modules: give it rooms inside"
        if pkg.relative_to(PKG).parts[:1] not in (("run",), ("nodes",)):
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        rooms = sorted(d.name + "/" for d in pkg.iterdir() if d.is_dir() and d.name != "__pycache__")
        missing = [m for m in mods + rooms if not re.search(rf"(?m)^{re.escape(m)}\s", doc)]
        assert missing == [], f"{init.relative_to(ROOT)} does not map {missing}"
