"""The master's UI process never imports torch, transformers or deepspeed (seconds each,
and nothing it needs): importing the wizard and the CLI, and walking the wizard through
every step with its live advice, estimate and plan preview, leaves them out of
sys.modules. Runs in a fresh interpreter, so nothing imported by other tests counts."""

from __future__ import annotations

import json
import subprocess
import sys

from support.paths import DEMO, ROOT

HEAVY = ["torch", "transformers", "deepspeed", "peft"]

SCRIPT = """
import asyncio, importlib, json, sys
import qwen_tui, qwen_tui.ui
from qwen_tui.ui.app import WizardApp
import qwen_tui.cli.main

for m in MODS:
    importlib.import_module(m)
qwen_tui.cli.main.build_parser().format_help()

async def walk():
    app = WizardApp(PRESET, runs_root=RUNS, reattach=False)
    seen = []
    async with app.run_test(size=(140, 44)) as pilot:
        for key in ("f1", "f2", "f3", "f4", "f5", "f6"):
            await pilot.press(key)
            await pilot.pause(0.2)
            seen.append(app.screen.STEP)
    return seen

steps = asyncio.run(walk())
print(json.dumps({"mods": MODS, "steps": steps, "heavy": [h for h in HEAVY if h in sys.modules]}))
"""


def test_the_wizard_and_the_cli_never_import_torch_transformers_or_deepspeed(tmp_path):
    # every module of the faces
    files = sorted((ROOT / "qwen_tui" / "ui").rglob("*.py")) + sorted((ROOT / "qwen_tui" / "cli").rglob("*.py"))
    mods = [".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for f in files]
    code = f"PRESET = {str(DEMO)!r}\nRUNS = {str(tmp_path / 'runs')!r}\nHEAVY = {HEAVY!r}\nMODS = {mods!r}\n" + SCRIPT
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert "qwen_tui.ui.app" in res["mods"] and "qwen_tui.cli.estimate" in res["mods"]
    assert res["steps"] == ["nodes", "ssh", "network", "training", "review", "run"]  # the walk really happened
    assert res["heavy"] == [], f"the UI process imported {res['heavy']}"
