"""Nothing typed is lost without a question: removing a node asks, ctrl+o over unsaved
changes asks, and launching into an output directory that already holds a run asks."""

from __future__ import annotations

import pytest
import yaml
from textual.events import Key
from textual.widgets import DataTable

from qwen_tui.cluster.facts import ClusterFacts
from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.modals import Confirm, Form
from qwen_tui.wizard.state import BAD

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


async def settle(pilot, done, what: str) -> None:
    """Bounded: the burst's keys take a few message hops; 5 s is far beyond them."""
    for _ in range(100):
        await pilot.pause(0.05)
        if done():
            return
    raise AssertionError(what())


def burst(app, *ks: str) -> None:
    """Keys as a terminal delivers them when the machine is busy: all queued at once, none waited for."""
    for k in ks:
        app.post_message(Key(k, k if len(k) == 1 else None))


async def test_a_burst_of_keys_lands_in_order_in_the_form(tmp_path, demo_copy):
    """ctrl+u, end, backspace and tab are bindings, which Textual runs in the App after the characters typed
    behind them: "ctrl+u 0.002" ended as "" with 0.002 in the preset, "tab 7" typed the 7 in the field left."""
    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        lr, steps = (app.screen.query_one(f"#training-{f}") for f in ("learning_rate", "max_steps"))
        app.screen.query_one("#training-gradient_checkpointing").focus()  # a select, the field before
        await pilot.pause()
        # epochs lies between the two inputs; backspace takes back the 3 typed by mistake
        burst(app, "tab", "end", "ctrl+u", "0", ".", "0", "0", "3", "backspace", "2", "tab", "tab", "end", "ctrl+u",
              "7")
        await settle(pilot, lambda: steps.value == "7" and app.state.preset.training.max_steps == 7,
                     lambda: f"fields {lr.value!r} {steps.value!r}, errors {app.state.field_errors}")
        assert lr.value == "0.002" and app.state.preset.training.learning_rate == 0.002
        assert app.state.field_errors == {} and app.focused is steps


async def test_a_burst_of_keys_lands_in_order_in_a_dialog(tmp_path, demo_copy):
    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    answers = []
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(Form("Two fields", [("a", "first", "old"), ("b", "second", "")]), answers.append)
        await pilot.pause()
        burst(app, "end", "ctrl+u", "n", "e", "x", "backspace", "w", "tab", "x", "y", "left", "z")
        first, second = (app.screen.query_one(f"#f-{n}") for n in "ab")
        await settle(pilot, lambda: second.value == "xzy", lambda: f"fields {first.value!r} {second.value!r}")
        assert first.value == "new"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert answers == [{"a": "new", "b": "xzy"}]


async def test_typing_back_the_old_value_takes_back_the_refusal(tmp_path, demo_copy):
    """A refused value, then the preset's own value typed again: the refusal goes, and the preset stays clean (it
    asked for no change). The screen once skipped the second edit as "unchanged", and the refusal stayed."""
    preset = demo_copy()
    data = yaml.safe_load(preset.read_text())
    data["network"]["master_port"] = port = 47767  # nothing binds it; 5 digits: 477670 is refused at once
    preset.write_text(yaml.safe_dump(data, sort_keys=False))
    app = WizardApp(str(preset), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f3")
        await pilot.pause()
        app.screen.query_one("#master_port").focus()
        await pilot.pause()
        burst(app, "end", "0")
        await settle(pilot, lambda: "network.master_port" in app.state.field_errors,
                     lambda: f"not refused: {app.state.field_errors}")
        assert app.state.step_status("network") == BAD
        burst(app, "backspace")  # the port as it was
        await settle(pilot, lambda: not app.state.field_errors, lambda: f"still refused: {app.state.field_errors}")
        assert app.state.preset.network.master_port == port and not app.state.dirty
