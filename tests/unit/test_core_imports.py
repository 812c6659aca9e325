"""The master's core never pulls in Textual or torch (they cost seconds to import)."""

import json
import subprocess
import sys

CORE = ["qwen_tui.preset.schema", "qwen_tui.plan.launch", "qwen_tui.cluster.facts", "qwen_tui.cli.main",
        "qwen_tui.run.launcher", "qwen_tui.run.export.render", "qwen_tui.cli.live", "qwen_tui.nodes.transport"]
HEAVY = ["textual", "torch", "transformers", "deepspeed", "peft"]


def test_core_imports_no_textual_or_torch():
    code = ("import importlib, json, sys, pkgutil\n"
            "import qwen_tui\n"
            f"mods = {CORE!r}\n"
            "for name in [m.name for m in pkgutil.walk_packages(qwen_tui.__path__, 'qwen_tui.')]:\n"
            "    if not name.startswith('qwen_tui.ui') and name not in mods: mods.append(name)\n"
            "for m in mods: importlib.import_module(m)\n"
            f"print(json.dumps({{'mods': mods, 'heavy': [h for h in {HEAVY!r} if h in sys.modules]}}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.splitlines()[-1])
    assert "qwen_tui.cli.main" in res["mods"]
    assert res["heavy"] == [], f"core imported {res['heavy']}"


def test_training_never_imports_qwen_tui():
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parents[2] / "training"
    pat = re.compile(r"^\s*(from\s+qwen_tui|import\s+qwen_tui)|import_module\(['\"]qwen_tui", re.M)
    offenders = [str(p) for p in root.rglob("*.py") if pat.search(p.read_text())]
    assert offenders == []
