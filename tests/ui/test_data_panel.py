"""Pilot test of the Training step's data preview: F9 runs the real preview (the master tokenizes the demo data
in a subprocess, from a thread worker) and the panel shows its counts, bars and advice; a change marks it stale."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from textual.widgets import Input

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.widgets.data_panel import HINT, DataPanel
from support.paths import DEMO, ROOT

pytestmark = pytest.mark.anyio
SIZE = (140, 44)


async def _wait_for(pilot, done, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"the data preview did not finish in time: {[n.message for n in pilot.app._notifications]!r} {_text(pilot.app.screen.query_one(DataPanel))}"
        await asyncio.sleep(0.2)
        await pilot.pause()


def _text(panel: DataPanel) -> str:
    import io

    from rich.console import Console

    out = io.StringIO()
    # what the panel was last given, each line whole: at a fixed width a long path (pytest's temp dirs differ in
    # length from one machine to the next) wrapped the message the tests look for
    Console(file=out, width=100_000, color_system=None).print(panel.content)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


async def test_f9_previews_the_data_and_a_change_makes_it_stale(tmp_path):
    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False, base_dir=str(ROOT),
                    local_python=sys.executable)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        panel = app.screen.query_one(DataPanel)
        assert HINT in _text(panel)
        # model_max_length 64 cuts many demo records: the preview must say so, with the fix
        inp = app.screen.query_one("#training-model_max_length", Input)
        inp.value = "64"
        await pilot.pause()
        assert app.state.preset.training.model_max_length == 64
        await pilot.press("f9")
        await pilot.pause()
        assert "tokenizing" in _text(panel)
        await _wait_for(pilot, lambda: panel.report is not None or "✘" in _text(panel))
        text = _text(panel)
        assert panel.report is not None, text
        r = panel.report
        assert r["records"] == 400 and r["truncated"] > 4
        assert f"records 400: {r['usable']} usable" in text
        assert "length p50" in text and "│" in text and "DATA_TRUNCATED" in text
        assert f"raise model_max_length to the p99 ({r['length_percentiles']['p99']})" in text
        assert "stale" not in text
        inp.value = "256"
        await pilot.pause()
        assert "the preset changed since" in _text(panel)


async def test_a_bad_data_path_shows_the_error_not_a_crash(tmp_path):
    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False, base_dir=str(ROOT),
                    local_python=sys.executable)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        deep = tmp_path / ("d" * 150)  # longer than any line: the message wraps on a screen, whatever tmp_path is
        app.screen.query_one("#training-data", Input).value = str(deep / "missing.jsonl")
        await pilot.pause()
        await pilot.press("f9")
        panel = app.screen.query_one(DataPanel)
        await _wait_for(pilot, lambda: "✘" in _text(panel))
        assert "missing.jsonl: data file not found" in _text(panel)
        assert app.screen.STEP == "training"


def test_an_edit_leaves_a_local_nodes_python_to_qwen_tui():
    """The wizard's edits keep unset fields unset: a local node without a python of its own keeps running
    qwen-tui's interpreter (the preview and the launch), not "python3" from the default."""
    from qwen_tui.plan.launch import make_plan
    from qwen_tui.preset.files import load_preset

    p = load_preset(DEMO).with_changes({"training.model_max_length": 64, "network.nccl_timeout": 100})
    assert p.training.model_max_length == 64 and p.network.nccl_timeout == 100
    plan = make_plan(p, run_id="r", local_run_dir="/tmp/r", local_python="/venv/bin/python")
    assert plan.nodes[0].argv[0] == "/venv/bin/python"
