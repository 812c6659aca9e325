"""Nothing typed is lost without a question: removing a node asks, ctrl+o over unsaved
changes asks, and launching into an output directory that already holds a run asks."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from qwen_tui.cluster.facts import ClusterFacts
from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.modals import Confirm, Form

pytestmark = pytest.mark.anyio
SIZE = (160, 48)


def title(app) -> str:
    return str(app.screen.query_one(".dialog-title").render())


async def test_removing_a_node_asks_and_no_keeps_it(tmp_path, demo_copy):
    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        app.screen.query_one(DataTable).move_cursor(row=1)
        await pilot.press("delete")
        await pilot.pause()
        assert isinstance(app.screen, Confirm) and title(app) == "Remove node 1?"
        await pilot.press("escape")
        await pilot.pause()
        assert len(app.state.preset.cluster.nodes) == 2 and not app.state.dirty
        await pilot.press("delete")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert len(app.state.preset.cluster.nodes) == 1 and app.state.dirty


async def test_open_over_unsaved_changes_asks_first(tmp_path, demo_copy):
    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")  # nothing unsaved: straight to the path
        await pilot.pause()
        assert isinstance(app.screen, Form)
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("f4")
        await pilot.pause()
        app.screen.query_one("#training-learning_rate").value = "0.0005"
        await pilot.pause()
        assert app.state.dirty
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, Confirm) and title(app) == "Open another preset?"
        await pilot.press("n")
        await pilot.pause()
        assert not isinstance(app.screen, (Confirm, Form)) and app.state.preset.training.learning_rate == 0.0005
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert isinstance(app.screen, Form)


async def test_launch_into_an_output_dir_holding_a_run_asks(tmp_path, demo_copy, monkeypatch):
    preset = demo_copy()
    out = tmp_path / "out"
    (out / "checkpoint-20").mkdir(parents=True)
    (out / "adapter_model.safetensors").write_bytes(b"x")
    app = WizardApp(str(preset), runs_root=str(tmp_path / "runs"), reattach=False, base_dir=str(tmp_path))
    launched = []
    async with app.run_test(size=SIZE) as pilot:
        monkeypatch.setattr(app.get_screen("run"), "launch", lambda force=False: launched.append(force))
        await pilot.press("f5")
        await pilot.pause()
        await pilot.press("l")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, Confirm) and title(app) == "The output directory already holds a run"
        body = str(app.screen.query_one(".dialog-body").render())
        assert "checkpoint-20" in body and "adapter_model.safetensors" in body and str(out) in body
        await pilot.press("n")
        await pilot.pause()
        assert launched == [] and app.screen.STEP == "review"
        # an empty output directory: no question
        for p in (out / "adapter_model.safetensors",):
            p.unlink()
        (out / "checkpoint-20").rmdir()
        await pilot.press("l")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert launched == [False] and app.screen.STEP == "run"


async def test_launch_asks_about_errors_then_the_output_dir_and_launches_only_after_both_yeses(tmp_path, demo_copy,
                                                                                              monkeypatch):
    """Review's l: the checks' errors first, then the output directory; a no to either launches nothing. The Run
    step's l asks only about the output directory (its launch runs the checks itself)."""
    preset = demo_copy()
    (tmp_path / "out" / "checkpoint-20").mkdir(parents=True)
    app = WizardApp(str(preset), runs_root=str(tmp_path / "runs"), reattach=False, base_dir=str(tmp_path),
                    facts=ClusterFacts(master_port_free=False))  # an error: PORT_IN_USE
    launched = []
    async with app.run_test(size=SIZE) as pilot:
        monkeypatch.setattr(app.get_screen("run"), "launch", lambda force=False: launched.append(force))
        assert any(a.code == "PORT_IN_USE" for a in app.state.advice)
        await pilot.press("f5")
        await pilot.pause()

        async def launch_answering(*answers: str) -> list[str]:
            asked = []
            await pilot.press("l")
            await app.workers.wait_for_complete()
            await pilot.pause()
            for key in answers:
                assert isinstance(app.screen, Confirm)
                asked.append(title(app))
                await pilot.press(key)
                await pilot.pause()
            assert not isinstance(app.screen, Confirm)
            return asked

        assert await launch_answering("n") == ["Launch despite errors?"]
        assert launched == [] and app.screen.STEP == "review"
        assert await launch_answering("y", "n") == ["Launch despite errors?",
                                                    "The output directory already holds a run"]
        assert launched == [] and app.screen.STEP == "review"
        assert await launch_answering("y", "y") == ["Launch despite errors?",
                                                    "The output directory already holds a run"]
        assert launched == [True] and app.screen.STEP == "run"  # forced past the errors it was told of
        assert await launch_answering("y") == ["The output directory already holds a run"]
        assert launched == [True, False]
