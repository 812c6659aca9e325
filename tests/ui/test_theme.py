"""The wizard's colours come from the Textual theme (ui/styles.py): another theme recolours the steps."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.color import Color

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.styles import GOOD, tone
from qwen_tui.ui.widgets.stepper import Stepper

from .conftest import DEMO


def stepper_colours(app: WizardApp) -> set[str]:
    content = app.screen.query_one(Stepper).content
    assert isinstance(content, Text)
    return {str(span.style) for span in content.spans}


def theme_hex(app: WizardApp, name: str) -> str:
    return Color.parse(app.theme_variables[name]).hex6


@pytest.mark.anyio
async def test_a_theme_change_recolours_the_steps(tmp_path):
    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=(120, 36)) as pilot:
        app.state.node(0).probe = app.state.node(1).probe = "ok"  # the Nodes step turns green
        app.facts_changed()
        await pilot.pause()
        assert app.theme == "textual-dark"
        dark = theme_hex(app, "success")
        assert any(dark in s for s in stepper_colours(app)) and tone(GOOD) == dark
        app.theme = "gruvbox"
        await pilot.pause()
        await pilot.pause()
        light = theme_hex(app, "success")
        assert light != dark and tone(GOOD) == light
        colours = stepper_colours(app)
        assert any(light in s for s in colours) and not any(dark in s for s in colours), colours


def test_outside_an_app_the_default_theme_colours():
    assert tone("bold $error on $panel").startswith("bold #")
    assert tone("dim") == "dim" and tone("$text-muted") == "default"  # no plain colour: the terminal's own
