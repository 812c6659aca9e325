"""What a new user met on a first day with the wizard, each fixed: an import that asked nothing and took
`bad_host! slots=x` for a host; a save that rewrote `zero_stage: null`; a preset with one unknown key thrown
away for a blank one; the last preset's network results after ctrl+o; `?` typing over a field; a palette
that did not find the footers' actions; pydantic's own words under a field; a host name checked only at
connect time; Add node offering 8 GPUs beside nodes of 1; an estimate that did not say it was stale."""

from __future__ import annotations

import pytest
import yaml
from textual.command import CommandInput, CommandPalette
from textual.widgets import DataTable, Input, Label, Static

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.help import HelpPanel
from qwen_tui.ui.modals import Choose, Confirm, Form, Notice
from qwen_tui.ui.screens.base import StepScreen
from support.facts import slow_h200_facts
from support.paths import DEMO, ROOT

pytestmark = pytest.mark.anyio
SIZE = (100, 30)


def text_of(w) -> str:
    return str(w.render())


async def import_text(pilot, app, text: str) -> None:
    await pilot.press("i")
    await pilot.pause()
    app.screen.query_one("#text").text = text
    await pilot.press("ctrl+s")
    await pilot.pause()


async def test_hostfile_import_names_bad_lines_and_asks_replace_or_add(tmp_path, demo_copy):
    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        before = app.state.preset.cluster.nodes
        await import_text(pilot, app, "good-1 slots=2\nbad_host! slots=x\n# a comment\nn3 slots=0\n")
        assert isinstance(app.screen, Notice)
        body = text_of(app.screen.query_one(".dialog-body"))
        assert "line 2: bad_host! slots=x: 'bad_host!' is not a host name or address (it holds '!')" in body
        assert "line 4: n3 slots=0: slots must be a whole number from 1 to 64, got '0'" in body
        assert "good-1" not in body and app.state.preset.cluster.nodes == before  # nothing imported by halves
        await pilot.press("escape")
        await pilot.pause()

        await import_text(pilot, app, "w1 slots=1\nw2 slots=1\n")
        assert isinstance(app.screen, Choose) and "Import 2 node(s)" in text_of(app.screen.query_one(".dialog-title"))
        await pilot.press("escape")  # go back: nothing changes
        await pilot.pause()
        assert app.state.preset.cluster.nodes == before

        await import_text(pilot, app, "w1 slots=1\nw2 slots=1\n")
        await pilot.press("a")  # add after the nodes there
        await pilot.pause()
        assert [n.host for n in app.state.preset.cluster.nodes] == ["localhost", "localhost", "w1", "w2"]

        await import_text(pilot, app, "w3 slots=4\n")
        await pilot.press("r")  # replace them
        await pilot.pause()
        assert [(n.host, n.gpus) for n in app.state.preset.cluster.nodes] == [("w3", 4)]


async def test_saving_keeps_an_untouched_null(tmp_path, demo_copy):
    path = demo_copy()
    assert "zero_stage: null" in path.read_text()
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        app.screen.query_one("#training-learning_rate", Input).value = "0.001"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
    text = path.read_text()
    assert "learning_rate: 0.001" in text and "  zero_stage: null\n" in text


async def test_one_unknown_key_keeps_the_preset_and_the_file(tmp_path, demo_copy):
    path = demo_copy()
    data = yaml.safe_load(path.read_text())
    data["name"] = "kept"
    data["training"]["learning_rat"] = 0.01
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    before = path.read_bytes()
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, Notice)
        body = text_of(app.screen.query_one(".dialog-body"))
        assert "training.learning_rat: unknown key (did you mean 'learning_rate'?)" in body
        assert app.state.preset.name == "kept" and app.state.path == path  # the rest is open, not a blank preset
        assert app.state.preset.network.master_port == data["network"]["master_port"]
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("f4")
        await pilot.pause()
        app.screen.query_one("#training-max_steps", Input).value = "7"
        await pilot.pause()
        await pilot.press("ctrl+s")  # saving over it asks: the unknown line would go
        await pilot.pause()
        assert isinstance(app.screen, Confirm)
        assert "unknown keys" in text_of(app.screen.query_one(".dialog-title"))
        await pilot.press("n")
        await pilot.pause()
        assert path.read_bytes() == before  # nothing saved over it
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("y")  # said so: written without the unknown key
        await pilot.pause()
    saved = yaml.safe_load(path.read_text())
    assert "learning_rat" not in saved["training"] and saved["training"]["max_steps"] == 7


async def test_opening_another_preset_forgets_the_last_ones_network_results(tmp_path, demo_copy):
    app = WizardApp(str(DEMO), facts=slow_h200_facts(2.0), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        app.state.net_checked = True
        app.state.node(1).probe = "ok"
        await pilot.press("f3")
        await pilot.pause()
        table = app.screen.query_one("#net-table", DataTable)
        assert "reachable" in str(table.get_row_at(1)[4])
        await pilot.press("ctrl+o")
        await pilot.pause()
        app.screen.query_one("#f-path", Input).value = str(ROOT / "presets" / "qwen2.5-7b-lora-2node-zero2.yaml")
        await pilot.press("ctrl+s")
        await pilot.pause()
        st = app.state
        assert st.preset.training.model == "Qwen/Qwen2.5-7B-Instruct"
        assert not st.facts.links and not st.facts.nodes and not st.net_checked and not st.net_findings
        assert st.node(1).probe == "not probed"
        assert str(table.get_row_at(1)[4]) == "not checked"
        assert st.step_status("network") == "todo"


async def test_question_mark_opens_help_and_never_types_over_a_field(tmp_path):
    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        model = app.screen.query_one("#training-model", Input)
        assert app.focused is model
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpPanel)
        assert model.value == "builtin:tiny" and app.state.preset.training.model == "builtin:tiny"
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("ctrl+o")  # in a dialog's field `?` is a character like any other
        await pilot.pause()
        app.screen.query_one("#f-path", Input).value = ""
        await pilot.press("question_mark")
        await pilot.pause()
        assert app.screen.query_one("#f-path", Input).value == "?"


async def palette_pick(pilot, app, query: str) -> None:
    await pilot.press("ctrl+p")
    await pilot.pause()
    assert isinstance(app.screen, CommandPalette)
    app.screen.query_one(CommandInput).value = query
    await pilot.pause(0.5)  # the palette searches its providers in the background
    await pilot.press("enter")
    await pilot.pause(0.3)


async def test_palette_lists_every_footer_action_and_runs_it_on_its_step(tmp_path):
    from qwen_tui.ui.app import _screens

    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for step, cls in _screens().items():
            for b in cls.BINDINGS:
                if b.show and b.description and not b.action.startswith("app."):
                    assert any(t.endswith(f": {b.description}") for t in titles), (step, b.description)
        for word in ("Launch", "Export", "Probe", "Stop", "Preview data", "Add"):
            assert any(word in t for t in titles), word
        assert titles.count("Keys") == 1

        await pilot.press("f5")
        await pilot.pause()
        await palette_pick(pilot, app, "Nodes: Add")  # from another step: it goes there and opens the form
        assert isinstance(app.screen, Form) and app.get_screen("nodes") in app.screen_stack
        assert app.screen.query_one("#f-gpus", Input).value == "1"  # as the nodes there, not 8
        await pilot.press("escape")
        await pilot.pause()

        await palette_pick(pilot, app, "Keys")  # the wizard's keys, not Textual's Input bindings
        assert isinstance(app.screen, HelpPanel)
        assert "Probe" in str(app.screen.query_one("#help-keys").render())
        await pilot.press("escape")
        await pilot.pause()

        await pilot.press("ctrl+p")
        await pilot.pause()
        assert isinstance(app.screen, CommandPalette)
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, StepScreen)


async def test_a_host_is_checked_as_it_is_typed(tmp_path, demo_copy):
    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a")
        await pilot.pause()
        await pilot.press(*"bad_host!")
        await pilot.pause()
        err = app.screen.query_one("#form-error", Static)
        assert text_of(err) == "host: 'bad_host!' is not a host name or address (it holds '!')"
        await pilot.press("ctrl+s")  # OK waits for the fix
        await pilot.pause()
        assert isinstance(app.screen, Form) and len(app.state.preset.cluster.nodes) == 2
        await pilot.press("backspace")
        await pilot.pause()
        assert text_of(err) == ""
        app.screen.query_one("#f-port", Input).value = "70000"
        await pilot.pause()
        assert text_of(err) == "port: must be a whole number from 1 to 65535, got '70000'"
        app.screen.query_one("#f-port", Input).value = "22"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert [n.host for n in app.state.preset.cluster.nodes][-1] == "bad_host"


async def test_the_estimate_says_it_is_stale_while_a_value_is_refused(tmp_path, demo_copy):
    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        title = app.screen.query_one("#estimate-title", Label)
        assert text_of(title) == "Live estimate"
        app.screen.query_one("#training-per_device_train_batch_size", Input).value = "eight"
        await pilot.pause()
        assert text_of(title) == "Live estimate: stale, batch per GPU refused (old value used)"
        err = app.screen.query_one("#err-training-per_device_train_batch_size", Static)
        assert text_of(err) == "batch per GPU: must be a whole number, got 'eight'"
        app.screen.query_one("#training-per_device_train_batch_size", Input).value = "4"
        await pilot.pause()
        assert text_of(title) == "Live estimate" and app.state.preset.training.per_device_train_batch_size == 4


async def test_a_data_path_this_machine_lacks_is_said_as_it_is_typed(tmp_path, demo_copy):
    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False, base_dir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        app.screen.query_one("#training-data", Input).value = "chats/missing.jsonl"
        await pilot.pause()
        err = app.screen.query_one("#err-training-data", Static)
        assert text_of(err) == "data (JSON/JSONL): chats/missing.jsonl does not exist on this machine (node 0) yet"
        assert app.state.preset.training.data == "chats/missing.jsonl"  # noted, not refused
        (tmp_path / "chats").mkdir()
        (tmp_path / "chats" / "here.jsonl").write_text("{}\n")
        app.screen.query_one("#training-data", Input).value = "chats/here.jsonl"
        await pilot.pause()
        assert text_of(err) == ""
