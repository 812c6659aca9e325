"""Help that a new user finds: F10 or `?` opens each step's help with its keys; the command
palette (ctrl+p) goes to a step, applies a fix, saves, opens, changes the theme; the first
field of the Training step has focus; F8 on advice without an automatic fix says what to do."""

from __future__ import annotations

import pytest
from textual.command import CommandInput, CommandPalette
from textual.widgets import Input

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.help import STEP_HELP, HelpPanel
from qwen_tui.ui.widgets.advice_list import AdviceList
from support.paths import DEMO, ROOT

pytestmark = pytest.mark.anyio
SIZE = (160, 48)


def shown(w) -> str:
    from rich.console import Console

    con = Console(width=300, record=True, file=open("/dev/null", "w"))
    con.print(w.content)
    return con.export_text()


@pytest.mark.parametrize("step_key,step", [("f1", "nodes"), ("f2", "ssh"), ("f3", "network"), ("f4", "training"),
                                           ("f5", "review"), ("f6", "run")])
async def test_help_panel_for_every_step(tmp_path, step_key, step):
    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(step_key)
        await pilot.pause()
        step_screen = app.screen
        await pilot.press("f10")
        await pilot.pause()
        assert isinstance(app.screen, HelpPanel)
        assert shown(app.screen.query_one("#help-body")).split()[:4] == STEP_HELP[step].split()[:4]
        keys = shown(app.screen.query_one("#help-keys"))
        for b in type(step_screen).BINDINGS:
            assert b.description in keys
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is step_screen
        if step in ("nodes", "review", "run"):  # no input has focus there: `?` works too
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpPanel)


async def palette(pilot, app, query: str) -> None:
    await pilot.press("ctrl+p")
    await pilot.pause()
    assert isinstance(app.screen, CommandPalette)
    app.screen.query_one(CommandInput).value = query
    await pilot.pause(0.5)  # the palette searches its providers in the background
    await pilot.press("enter")
    await pilot.pause()


async def test_palette_goes_to_a_step_applies_a_fix_saves_and_changes_theme(tmp_path, demo_copy):
    path = demo_copy(per_device_train_batch_size=2)
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await palette(pilot, app, "Go to step 4")
        assert app.screen.STEP == "training"
        assert "LORA_BATCH_RANGE" in [a.code for a in app.state.advice]  # the demo at batch 4 under LoRA
        await palette(pilot, app, "Apply fix: Effective batch")
        assert "LORA_BATCH_RANGE" not in [a.code for a in app.state.advice]
        assert app.state.preset.effective_batch_size >= 8 and app.state.dirty
        # the form shows the fixed values
        t = app.state.preset.training
        assert app.screen.query_one("#training-gradient_accumulation_steps", Input).value == \
            str(t.gradient_accumulation_steps)
        await palette(pilot, app, "Save preset")
        assert not app.state.dirty and f"gradient_accumulation_steps: {t.gradient_accumulation_steps}" in \
            path.read_text()
        theme = app.theme
        await pilot.press("ctrl+p")
        await pilot.pause()
        app.screen.query_one(CommandInput).value = "theme"
        await pilot.pause(0.5)
        await pilot.press("enter")  # "Theme": a second palette lists the themes
        await pilot.pause(0.5)
        await pilot.press("down", "enter")
        await pilot.pause()
        assert app.theme != theme


async def test_palette_opens_a_preset(tmp_path):
    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await palette(pilot, app, "Open preset")
        app.screen.query_one("#f-path", Input).value = str(ROOT / "presets" / "qwen2.5-7b-lora-2node-zero2.yaml")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.state.preset.training.model == "Qwen/Qwen2.5-7B-Instruct"


async def test_training_opens_with_its_first_field_focused(tmp_path):
    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        assert app.focused is app.screen.query_one("#training-model", Input)
        row = app.focused.parent
        label = row.query_one(".field-label")
        assert label.styles.color != app.screen.query_one("#training-data").parent.query_one(
            ".field-label").styles.color  # the focused row's label is lit


async def test_f8_on_advice_without_automatic_fix_shows_what_to_do(tmp_path):
    """Two nodes that disagree on torch: the advice says to install the same version; F8 shows
    that instruction (it changes nothing), never 'applied'."""
    from qwen_tui.cluster.facts import ClusterFacts, NodeFacts

    facts = ClusterFacts(nodes={0: NodeFacts(versions={"torch": "2.11.0"}, gpus=[]),
                                1: NodeFacts(versions={"torch": "2.9.0"}, gpus=[])})
    app = WizardApp(str(DEMO), facts=facts, runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        items = app.state.advice
        manual = [a for a in items if a.fix is not None and not a.fix.changes]
        assert manual, [a.code for a in items]
        lst = app.screen.query_one(AdviceList)
        lst.focus()
        lst.highlighted = lst.items.index(manual[0])
        before = app.state.preset
        await pilot.press("f8")
        await pilot.pause()
        body = str(app.screen.query_one(".dialog-body").render())
        assert manual[0].fix.hint in body and "to do by hand" in str(app.screen.query_one(".dialog-title").render())
        assert app.state.preset is before and not app.state.dirty
        await pilot.press("escape")
        await pilot.pause()
        # the highlight survives a refresh of the list (an edit recomputes the advice)
        app.screen.query_one("#training-learning_rate", Input).value = "0.001"
        await pilot.pause()
        assert lst.selected is not None and lst.selected.code == manual[0].code
