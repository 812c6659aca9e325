"""Fields a new user looked for: preset name, LoRA r/alpha/dropout, gradient checkpointing and
shared storage (Training), backend and rendezvous timeout (Network); export format as a select;
the import dialog shows each accepted format with an example."""

from __future__ import annotations

import pytest
from textual.widgets import Input, Select, Static

from qwen_tui.preset.files import load_preset
from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.modals import IMPORT_FORMATS, Form, ImportNodes

pytestmark = pytest.mark.anyio
SIZE = (160, 48)


async def test_training_and_network_fields_reach_the_saved_preset(tmp_path, demo_copy):
    path = demo_copy()
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        scr = app.screen
        scr.query_one("#name", Input).value = "my-first-run"
        scr.query_one("#training-lora_r", Input).value = "16"
        scr.query_one("#training-lora_alpha", Input).value = "32"
        scr.query_one("#training-lora_dropout", Input).value = "0.1"
        scr.query_one("#training-gradient_checkpointing", Select).value = False
        scr.query_one("#cluster-shared_storage", Select).value = True
        await pilot.pause()
        scr.query_one("#training-lora_dropout", Input).value = "1.5"  # refused: dropout < 1
        await pilot.pause()
        assert "less than 1" in str(scr.query_one("#err-training-lora_dropout", Static).render())
        scr.query_one("#training-lora_dropout", Input).value = "0.1"
        await pilot.press("f3")
        await pilot.pause()
        app.screen.query_one("#backend", Select).value = "gloo"
        rdzv = app.screen.query_one("#rdzv_timeout", Input)
        rdzv.value = "0"
        await pilot.pause()
        assert str(app.screen.query_one("#field-errors", Static).render()) == \
            "rendezvous timeout: must be at least 1, got 0"
        rdzv.value = "120"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
    p = load_preset(path)
    t = p.training
    assert p.name == "my-first-run" and (t.lora_r, t.lora_alpha, t.lora_dropout) == (16, 32, 0.1)
    assert t.gradient_checkpointing is False and p.cluster.shared_storage is True
    assert p.network.backend == "gloo" and p.network.rdzv_timeout == 120


async def test_export_format_is_a_select(tmp_path, demo_copy):
    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f5")
        await pilot.pause()
        await pilot.press("x")
        await pilot.pause()
        form = app.screen
        assert isinstance(form, Form)
        fmt = form.query_one("#f-format", Select)
        assert [v for _, v in fmt._options if v is not Select.BLANK] == ["slurm", "pbs", "sh", "kubeflow", "skypilot"]
        fmt.value = "sh"
        form.query_one("#f-output", Input).value = str(tmp_path / "export")
        await pilot.press("ctrl+s")
        await pilot.pause()
    written = sorted(p.name for p in (tmp_path / "export").iterdir())
    assert written and all(n.endswith(".sh") for n in written), written


async def test_import_dialog_shows_each_format_with_an_example(tmp_path, demo_copy):
    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("i")
        await pilot.pause()
        dlg = app.screen
        assert isinstance(dlg, ImportNodes)
        def shown():
            return str(dlg.query_one("#import-format", Static).render())

        assert "slots=8" in shown() and "Example" in shown()
        dlg.query_one("#kind", Select).value = "slurm"
        await pilot.pause()
        assert "gpu[01-04,07]" in shown()
        dlg.query_one("#text").text = "gpu[01-02]"
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("r")  # replace the nodes there (it asks: replace or add after)
        await pilot.pause()
        assert [n.host for n in app.state.preset.cluster.nodes] == ["gpu01", "gpu02"]
    assert set(IMPORT_FORMATS) == {"hostfile", "slurm", "ssh_config"}
