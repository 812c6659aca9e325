"""Pilot tests of the wizard: every step on localhost nodes with the local-demo
preset, live advice, field errors, node editing, and errors that never crash."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Input, Select

from qwen_tui.preset.files import load_preset
from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.widgets.advice_list import AdviceList
from support.facts import slow_h200_facts
from support.paths import DEMO

pytestmark = pytest.mark.anyio
SIZE = (140, 44)


def codes(app) -> list[str]:
    return [a.code for a in app.state.advice]


async def test_every_step_opens_from_its_key(tmp_path):
    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        seen = []
        for key in ("f2", "f3", "f4", "f5", "f6", "f1"):
            await pilot.press(key)
            await pilot.pause()
            seen.append(app.screen.STEP)
        assert seen == ["ssh", "network", "training", "review", "run", "nodes"]
        # the preset filled the Nodes step: two localhost nodes
        t = app.screen.query_one(DataTable)
        assert t.row_count == 2 and str(t.get_row_at(0)[1]) == "localhost"


async def test_zero3_warning_appears_and_disappears_on_a_slow_link(tmp_path):
    """Two GPU nodes on a measured 0.2 Gbit/s link: ZeRO-3 warns at once, ZeRO-2 clears
    it; the warning's fix applies with one key. (At 2 Gbit/s the demo's tiny model hides ZeRO-3's gathers under
    its host-bound step: no warning is due there.)"""
    app = WizardApp(str(DEMO), facts=slow_h200_facts(0.2), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        scr = app.screen
        # the demo trains on CPU in fp32; as GPU training in bf16 the ZeRO choice matters
        scr.query_one("#training-device", Select).value = "auto"
        scr.query_one("#training-precision", Select).value = "bf16"
        await pilot.pause()
        assert "ZERO3_SLOW_LINK" not in codes(app)
        scr.query_one("#training-zero_stage", Select).value = 3
        await pilot.pause()
        assert app.state.preset.training.zero_stage == 3
        assert "ZERO3_SLOW_LINK" in codes(app)
        shown = [a.code for a in scr.query_one(AdviceList).items]
        assert "ZERO3_SLOW_LINK" in shown
        scr.query_one("#training-zero_stage", Select).value = 2
        await pilot.pause()
        assert "ZERO3_SLOW_LINK" not in codes(app)
        assert "ZERO3_SLOW_LINK" not in [a.code for a in scr.query_one(AdviceList).items]

        # again, then apply its fix from the advice list with Enter
        scr.query_one("#training-zero_stage", Select).value = 3
        await pilot.pause()
        lst = scr.query_one(AdviceList)
        idx = [a.code for a in lst.items].index("ZERO3_SLOW_LINK")
        lst.focus()
        lst.highlighted = idx
        await pilot.press("enter")
        await pilot.pause()
        assert app.state.preset.training.zero_stage == 2
        assert "ZERO3_SLOW_LINK" not in codes(app)
        assert scr.query_one("#training-zero_stage", Select).value == 2  # the form follows the fix


async def test_invalid_value_shows_its_error_and_keeps_the_preset(tmp_path):
    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        inp = app.screen.query_one("#training-learning_rate", Input)
        inp.focus()
        inp.value = ""
        await pilot.press(*"abc")
        await pilot.pause()
        err = app.screen.query_one("#err-training-learning_rate")
        assert "number" in str(err.render()).lower()
        assert app.state.preset.training.learning_rate == 0.002  # unchanged
        inp.value = ""
        await pilot.press(*"1e-4")
        await pilot.pause()
        assert app.state.preset.training.learning_rate == 1e-4
        assert str(err.render()).strip() == ""
        # effective batch follows the batch field at once
        b = app.screen.query_one("#training-per_device_train_batch_size", Input)
        b.value = "4"
        await pilot.pause()
        assert app.state.estimate.effective_batch == 8
        assert "= 8" in app.state.estimate.batch_formula


async def test_nodes_add_edit_remove_import_and_save(tmp_path, demo_copy):
    path = demo_copy()
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a")
        await pilot.pause()
        form = app.screen
        form.query_one("#f-host", Input).value = "gpu-node-7"
        form.query_one("#f-gpus", Input).value = "8"
        await pilot.press("ctrl+s")
        await pilot.pause()
        nodes = app.state.preset.cluster.nodes
        assert [n.host for n in nodes] == ["localhost", "localhost", "gpu-node-7"] and nodes[2].gpus == 8
        # an invalid port is refused with the reason in the form, not a crash
        app.screen.query_one(DataTable).move_cursor(row=2)
        await pilot.press("e")
        await pilot.pause()
        app.screen.query_one("#f-port", Input).value = "99999"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "65535" in str(app.screen.query_one("#form-error").render())
        await pilot.press("escape")
        await pilot.pause()
        assert app.state.preset.cluster.nodes[2].port == 22
        await pilot.press("x")  # removing asks first: n keeps the node, y removes it
        await pilot.pause()
        await pilot.press("n")
        await pilot.pause()
        assert len(app.state.preset.cluster.nodes) == 3
        await pilot.press("x")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert len(app.state.preset.cluster.nodes) == 2
        # import a hostfile
        await pilot.press("i")
        await pilot.pause()
        app.screen.query_one("#text").text = "worker-1 slots=8\nworker-2 slots=8\n"
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("r")  # replace the nodes there (it asks: replace or add after)
        await pilot.pause()
        assert [(n.host, n.gpus) for n in app.state.preset.cluster.nodes] == [("worker-1", 8), ("worker-2", 8)]
        assert app.state.dirty
        await pilot.press("ctrl+s")  # save back to the opened preset (atomic, header kept)
        await pilot.pause()
        assert not app.state.dirty
    saved = load_preset(path)
    assert [n.host for n in saved.cluster.nodes] == ["worker-1", "worker-2"]


async def test_probe_localhost_nodes_in_parallel(tmp_path, demo_copy):
    app = WizardApp(str(demo_copy()), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        for _ in range(300):
            await pilot.pause(0.1)
            if all(app.state.node(i).probe not in ("connecting", "probing", "not probed") for i in range(2)):
                break
        assert [app.state.node(i).probe for i in range(2)] == ["ok", "ok"], app.state.nodes
        assert app.state.facts.nodes[0].python_version
        assert app.state.step_status("nodes") in ("ok", "warn", "bad")  # probed: no longer "todo"


async def test_a_failing_worker_becomes_an_error_modal_not_a_crash(tmp_path):
    from qwen_tui.ui.modals import Notice

    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        def boom(*a, **k):
            raise RuntimeError("node exploded")
        app.state.conns.connect = boom  # the network worker's first call
        await pilot.press("f3")
        await pilot.press("r")
        await pilot.pause(0.5)
        assert app.is_running and isinstance(app.screen, Notice)
        body = str(app.screen.query_one(".dialog-body").render())
        assert "RuntimeError: node exploded" in body and "in boom" in body
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen.STEP == "network"


async def test_bad_preset_opens_with_the_errors_shown(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ncluster:\n  nodes: []\ntraining:\n  model: x\n  data: y\n  zero_stage: 4\n")
    app = WizardApp(str(bad), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        body = str(app.screen.query_one(".dialog-body").render())
        assert "zero_stage" in body and "bad.yaml:7" in body
        await pilot.press("enter")
        assert app.screen.STEP == "nodes"  # and the wizard starts from a fresh preset


def test_connect_returns_nodes_connected_earlier_too(tmp_path):
    """A second connect (a check run again) gets every node, not only new ones: the wizard's
    connections live in its state (run.api.Connections), not in the App."""
    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    conns, preset = app.state.conns, app.state.preset
    first = conns.connect(preset)
    n = len(preset.cluster.nodes)
    assert sorted(first) == list(range(n)) and first.ok
    again = conns.connect(preset)
    assert again == first and all(again[i] is first[i] for i in range(n))
    assert sorted(conns.connect(preset, [n - 1])) == [n - 1]
    app.forget_connections()
    assert conns.transports() == {}


def test_one_network_check_replaces_only_its_own_findings():
    from qwen_tui.cluster.facts import ClusterFacts
    from qwen_tui.nodes.checks.findings import Finding
    from qwen_tui.nodes.checks.runner import NETWORK_CHECKS, replace_findings, run_network_check

    assert set(NETWORK_CHECKS) == {"port", "firewall", "bandwidth"}
    old = [Finding("warning", "LOW_BANDWIDTH", "slow", check="bandwidth"),
           Finding("error", "MASTER_PORT_UNREACHABLE", "blocked", check="port"),
           Finding("error", "HIGH_PORTS_BLOCKED", "blocked", check="nccl-ports"),
           Finding("warning", "FIREWALL_RULES", "rules", check="firewall")]
    new = [Finding("info", "BANDWIDTH", "fast", check="bandwidth")]
    assert [f.code for f in replace_findings(old, new, "bandwidth")] == \
        ["MASTER_PORT_UNREACHABLE", "HIGH_PORTS_BLOCKED", "FIREWALL_RULES", "BANDWIDTH"]
    # a port check that finds nothing clears both port columns
    assert [f.code for f in replace_findings(old, [], "port")] == ["LOW_BANDWIDTH", "FIREWALL_RULES"]
    with pytest.raises(ValueError):
        run_network_check(load_preset(DEMO), {}, "rehearsal", ClusterFacts())


async def test_review_shows_the_python_launch_gives_local_nodes(tmp_path):
    """Local nodes without a python of their own run qwen-tui's Python (the launch plan's local_python);
    Review must show that command, not the preset's default `python3`."""
    import sys

    from textual.widgets import Static

    app = WizardApp(str(DEMO), runs_root=str(tmp_path / "runs"), reattach=False)
    assert app.local_python == sys.executable
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f5")
        await pilot.pause()
        text = str(app.screen.query_one("#commands", Static).render())
        # Every node's command line starts with it; the default would have been "python3 -m torch...".
        assert text.count(f"{sys.executable} -m torch.distributed.run") == 2, text


async def test_review_masks_secret_environment_values(tmp_path):
    """A token in network.env is never on screen: Review's preset YAML and its commands show *** for it (a
    screenshot or a shared terminal would otherwise carry it), while the saved preset keeps the value."""
    from textual.widgets import Static

    from qwen_tui.preset.files import save_preset

    preset = load_preset(DEMO)
    preset.network.env = {"HF_TOKEN": "hf_very_secret_value", "NCCL_DEBUG": "INFO"}
    path = tmp_path / "secret.yaml"
    save_preset(preset, path)
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f5")
        await pilot.pause()
        yaml_text = app.screen.query_one("#yaml", Static).render()._renderable.code  # the Syntax's source
        commands = str(app.screen.query_one("#commands", Static).render())
        assert "hf_very_secret_value" not in yaml_text + commands
        assert "HF_TOKEN: '***'" in yaml_text and "NCCL_DEBUG: INFO" in yaml_text and "HF_TOKEN=***" in commands
    assert "hf_very_secret_value" in path.read_text()


async def test_an_edit_a_fix_and_a_node_edit_keep_the_local_nodes_interpreter(tmp_path):
    """Bug 2 of issue 18: an edit went through model_dump -> model_validate, which marked `python` as
    set, so local nodes ran `python3` (no torch there) instead of qwen-tui's own interpreter."""
    import sys

    from textual.widgets import Static

    # 0.2 Gbit/s: where the ZeRO-3 warning is due for the demo's tiny model (see above)
    app = WizardApp(str(DEMO), facts=slow_h200_facts(0.2), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        scr = app.screen
        scr.query_one("#training-device", Select).value = "auto"  # edits
        scr.query_one("#training-precision", Select).value = "bf16"
        scr.query_one("#training-zero_stage", Select).value = 3
        await pilot.pause()
        assert app.state.preset.training.zero_stage == 3
        lst = scr.query_one(AdviceList)  # an applied fix: ZeRO-3 on a slow link -> ZeRO-2
        lst.focus()
        lst.highlighted = [a.code for a in lst.items].index("ZERO3_SLOW_LINK")
        await pilot.press("enter")
        await pilot.pause()
        assert app.state.preset.training.zero_stage == 2
        for n in app.state.preset.cluster.nodes:
            assert "python" not in n.model_fields_set and n.python_for(app.local_python) == sys.executable
        await pilot.press("f1")  # a node edited through its form: only the label changes
        await pilot.pause()
        app.screen.query_one(DataTable).move_cursor(row=1)
        await pilot.press("e")
        await pilot.pause()
        assert app.screen.query_one("#f-python", Input).value == ""  # unset: not "python3"
        app.screen.query_one("#f-name", Input).value = "second"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.state.preset.cluster.nodes[1].name == "second"
        for n in app.state.preset.cluster.nodes:
            assert "python" not in n.model_fields_set and n.python_for(app.local_python) == sys.executable
        await pilot.press("f5")
        await pilot.pause()
        text = str(app.screen.query_one("#commands", Static).render())
        assert text.count(f"{sys.executable} -m torch.distributed.run") == 2, text
