"""`qwen-tui PATH` where PATH names no file yet starts a new preset that ctrl+s writes
there; a PATH that fails to open is never overwritten by ctrl+s."""

from __future__ import annotations

import pytest

from qwen_tui.preset.files import load_preset
from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.modals import Form, Notice

pytestmark = pytest.mark.anyio
SIZE = (160, 48)


async def test_a_new_path_is_a_new_preset_saved_there(tmp_path):
    path = tmp_path / "team" / "first-run.yaml"
    path.parent.mkdir()
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not isinstance(app.screen, Notice)  # no "could not be opened"
        assert app.state.path == path and app.state.preset.name == "first-run"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not isinstance(app.screen, Form)  # saved where the command line said, without asking
    assert load_preset(path).name == "first-run"


async def test_a_preset_that_fails_to_open_is_not_overwritten(tmp_path):
    path = tmp_path / "broken.yaml"
    text = "version: 1\ncluster: [\n"
    path.write_text(text)
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, Notice)
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, Form)  # asks where to save the new preset
    assert path.read_text() == text
