"""The Open dialog (ctrl+o) completes a typed path with Tab, as a shell does: a directory whole with its "/", a
file whole, several matches as far as they agree (and shown); a path with no match moves the focus on as before."""

from __future__ import annotations

import pytest

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.modals import Form
from qwen_tui.wizard.paths import complete_path
from support.paths import DEMO

pytestmark = pytest.mark.anyio


def test_complete_path(tmp_path):
    (tmp_path / "presets").mkdir()
    for name in ("alpha.yaml", "alpine.yml", "beta.yaml", "notes.txt", ".hidden.yaml"):
        (tmp_path / "presets" / name).write_text("")
    base = str(tmp_path)
    assert complete_path("pre", base).text == "presets/"  # a directory, whole
    assert complete_path("presets/b", base).text == "presets/beta.yaml"  # a file, whole
    several = complete_path("presets/al", base)
    assert several.text == "presets/alp" and several.options == ("alpha.yaml", "alpine.yml")
    assert complete_path("presets/", base).options == ("alpha.yaml", "alpine.yml", "beta.yaml")  # no .txt, no dot
    assert complete_path("presets/.h", base).text == "presets/.hidden.yaml"  # asked for by its dot
    assert complete_path("presets/x", base) == complete_path("presets/x", base).__class__("presets/x", ())
    assert complete_path(str(tmp_path / "presets" / "be"), "/elsewhere").text == str(tmp_path / "presets/beta.yaml")
    assert complete_path("nowhere/a", base).options == ()


async def test_tab_completes_the_open_dialogs_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "local-demo.yaml").write_text(DEMO.read_text())
    app = WizardApp(runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, Form)
        field = app.screen.query_one("#f-path")
        field.value = ""
        await pilot.press(*"pre", "tab", *"lo", "tab")
        await pilot.pause()
        assert field.value == "presets/local-demo.yaml" and app.focused is field  # Tab stayed in the field
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, Form)
        assert app.state.path is not None and app.state.path.name == "local-demo.yaml"
        assert app.state.preset.name == "local-demo"
