"""A 100x30 terminal: the stepper keeps all six steps, the footer every key of the step,
a form's OK/Cancel and its error stay in sight, and a refused value never turns back
into the old one silently (the step turns red, saving asks)."""

from __future__ import annotations

import pytest
from textual.widgets import Button, Input, Static
from textual.widgets._footer import FooterKey

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.widgets.stepper import Stepper
from qwen_tui.wizard.state import BAD
from support.paths import DEMO

pytestmark = pytest.mark.anyio
SMALL = (100, 30)


def on_screen(app, w) -> bool:
    """The widget is drawn where it claims to be: inside the terminal and not covered or scrolled away."""
    r = w.region
    if r.width == 0 or r.height == 0 or r.right > app.size.width or r.bottom > app.size.height:
        return False
    def mine(x: int) -> bool:
        hit, _ = app.screen.get_widget_at(x, r.y)
        return hit is w or w in hit.ancestors_with_self or hit in w.walk_children(with_self=True)

    return mine(r.x) and mine(r.right - 1)  # both ends: not half under another widget



async def test_a_refused_value_that_arrives_as_the_app_closes_is_kept_without_a_crash(tmp_path, demo_copy):
    """A form's last change can reach the App after its screens are gone (a fresh clone's run saw a refused
    value's message handled during shutdown, under load): it is recorded, and nothing is drawn on no screen."""
    from qwen_tui.ui.messages import ChangePreset

    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
    assert not app.screen_stack
    app.on_change_preset(ChangePreset({"training.save_steps": "often"}))
    assert app.state.field_errors["training.save_steps"][0] == "often"
    app.on_change_preset(ChangePreset({"training.save_steps": 9}))
    assert app.state.preset.training.save_steps == 9 and not app.state.field_errors

@pytest.mark.parametrize("key,step", [("f1", "nodes"), ("f2", "ssh"), ("f3", "network"), ("f4", "training"),
                                      ("f5", "review"), ("f6", "run")])
async def test_every_step_and_key_fits_100x30(tmp_path, key, step):
    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press(key)
        await pilot.pause()
        assert app.screen.STEP == step
        drawn = app.screen.query_one(Stepper).render()
        text = getattr(drawn, "plain", None) or str(drawn)
        assert len(text.rstrip()) <= SMALL[0]
        for i in range(1, 7):
            assert f"F{i} " in text, text
        keys = list(app.screen.query(FooterKey))
        shown = {k.description for k in keys if on_screen(app, k)}
        want = {b.description for b in type(app.screen).BINDINGS if b.show} | {"Save", "Open", "Help", "Quit"}
        assert want <= shown, f"cut off: {want - shown}"


@pytest.mark.parametrize("size", [SMALL, (80, 24)], ids=["100x30", "80x24"])
async def test_node_form_keeps_ok_cancel_and_its_error_in_sight(tmp_path, demo_copy, size):
    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=size) as pilot:
        await pilot.press("a")
        await pilot.pause()
        form = app.screen
        await pilot.press(*"gpu-9")  # typing goes to the first field
        assert form.query_one("#f-host", Input).value == "gpu-9"
        form.query_one("#f-port", Input).value = "not-a-port"
        await pilot.press("ctrl+s")
        await pilot.pause()
        form = app.screen  # shown again, with the problem
        err = form.query_one("#form-error", Static)
        assert "port" in str(err.render()).lower()
        for w in (err, form.query_one("#ok", Button), form.query_one("#cancel", Button)):
            assert on_screen(app, w), w
        assert form.query_one("#f-port", Input).value == "not-a-port"  # what was typed stays
        assert len(app.state.preset.cluster.nodes) == 2


async def test_a_refused_value_stays_marks_the_step_and_saving_asks(tmp_path, demo_copy):
    path = demo_copy()
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        inp = app.screen.query_one("#training-resume_from_checkpoint", Input)  # near the bottom of the form
        keep = app.screen.query_one("#training-save_steps", Input)
        keep.focus()
        keep.value = "often"
        await pilot.pause()
        err = app.screen.query_one("#err-training-save_steps", Static)
        # in plain words, naming the field as the form labels it (not pydantic's "Input should be a valid integer")
        assert str(err.render()) == "save every N steps: must be a whole number, got 'often'"
        await pilot.pause()
        assert on_screen(app, err), "the error scrolled out of sight"
        assert app.state.preset.training.save_steps != "often"
        assert app.state.step_status("training") == BAD
        inp.focus()
        await pilot.press("f1")
        await pilot.press("f4")
        await pilot.pause()
        assert app.screen.query_one("#training-save_steps", Input).value == "often"  # no bounce back
        before = path.read_text()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "Save with the old values?" in str(app.screen.query_one(".dialog-title").render())
        assert "training.save_steps: 'often' (must be a whole number)" in \
            str(app.screen.query_one(".dialog-body").render())
        await pilot.press("n")
        await pilot.pause()
        assert path.read_text() == before
        app.screen.query_one("#training-save_steps", Input).value = "7"
        await pilot.pause()
        assert app.state.step_status("training") != BAD and not app.state.field_errors
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "save_steps: 7" in path.read_text()


@pytest.mark.parametrize("key,step", [("f1", "nodes"), ("f2", "ssh"), ("f3", "network"), ("f4", "training"),
                                      ("f5", "review"), ("f6", "run")])
async def test_every_step_reflows_at_80x24_and_its_help_closes(tmp_path, demo_copy, key, step):
    """80x24, the smallest size: all six steps on top, Help, the step's keys and Quit in the footer (ctrl+s and
    ctrl+o still work, the palette and help list them), the help dialog with its Close button in sight."""
    from qwen_tui.ui.help import HelpPanel

    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(key)
        await pilot.pause()
        text = app.screen.query_one(Stepper).render().plain
        assert len(text.rstrip()) <= 80 and all(f"F{i} " in text for i in range(1, 7)), text
        shown = {k.description for k in app.screen.query(FooterKey) if on_screen(app, k)}
        want = {b.description for b in type(app.screen).BINDINGS if b.show} | {"Help", "Quit"}
        assert want <= shown, f"cut off: {want - shown}"
        body = app.screen.query_one("#body")
        assert body.region.right <= 80 and all(w.region.right <= 80 for w in body.query("*") if w.display)
        await pilot.press("f10")
        await pilot.pause()
        assert isinstance(app.screen, HelpPanel) and on_screen(app, app.screen.query_one("#close", Button))
        await pilot.press("escape")
        await pilot.pause()
        app.state.dirty = True
        await pilot.press("ctrl+s")  # not in the footer, still saves
        await pilot.pause()
        assert not app.state.dirty


@pytest.mark.parametrize("size", [(79, 24), (80, 23), (60, 15)])
async def test_below_80x24_a_step_says_the_terminal_is_too_small(tmp_path, size):
    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=size) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        notice = app.screen.query_one("#too-small", Static)
        assert notice.display and not app.screen.query_one("#body").display
        assert str(notice.render()).startswith(f"Terminal too small: {size[0]}x{size[1]}.")
        await pilot.resize_terminal(100, 30)  # made larger: the step is back
        await pilot.pause()
        assert not notice.display and app.screen.query_one("#body").display
