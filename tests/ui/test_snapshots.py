"""Snapshots of every screen (pytest-textual-snapshot), each at 160x48, 100x30 and 80x24
(the small terminals must keep every step, key and button: below 100x30 the steps reflow),
and the "terminal too small" notice below 80x24. Regenerate after an intended change:
pytest tests/ui/test_snapshots.py --snapshot-update"""

from __future__ import annotations

import pytest

from screenshots.snapshot_app import make_app, show_synthetic_run
from support.paths import ROOT


@pytest.fixture(params=[(160, 48), (100, 30), (80, 24)], ids=["160x48", "100x30", "80x24"])
def SIZE(request):
    return request.param


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def goto(key: str, extra=None):
    async def run_before(pilot) -> None:
        await pilot.press(key)
        await pilot.pause()
        if extra:
            await extra(pilot)
        await pilot.pause()
        from textual.widgets import Input

        for inp in pilot.app.screen.query(Input):  # a focused input's cursor blinks: on or off by the clock
            inp.cursor_blink = False
        await pilot.pause()
    return run_before


def test_nodes(snap_compare, SIZE):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=goto("f1"))


def test_ssh(snap_compare, SIZE):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=goto("f2"))


def test_network(snap_compare, SIZE):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=goto("f3"))


def test_training(snap_compare, SIZE):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=goto("f4"))


def test_training_zero3_warning(snap_compare, SIZE):
    async def zero3(pilot) -> None:
        from textual.widgets import Select

        # the demo's tiny model hides ZeRO-3's gathers under its step at 6.2 Gbit/s; at 0.2 the warning is due
        pilot.app.state.facts.links[1].bandwidth_gbps = 0.2
        pilot.app.facts_changed()
        scr = pilot.app.screen
        scr.query_one("#training-device", Select).value = "auto"
        scr.query_one("#training-precision", Select).value = "bf16"
        await pilot.pause()
        scr.query_one("#training-zero_stage", Select).value = 3
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=goto("f4", zero3))


def test_review(snap_compare, SIZE):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=goto("f5"))


def test_run(snap_compare, SIZE):
    async def fill(pilot) -> None:
        await show_synthetic_run(pilot.app)
        await pilot.pause(0.3)
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=goto("f6", fill))


def test_host_key_modal(snap_compare, SIZE):
    async def ask(pilot) -> None:
        from qwen_tui.ui.modals import host_key_question

        pilot.app.push_screen(host_key_question("gpu-node-1", "10.0.0.2", "ssh-ed25519",
                                                "SHA256:q9vJmG8yBf1kQn0d6mWc2cE3v3r0hJxk1o5d2mQ7s1E"))
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=goto("f2", ask))


def test_stop_all_modal(snap_compare, SIZE):
    async def ask(pilot) -> None:
        from qwen_tui.ui.modals import Confirm

        pilot.app.push_screen(Confirm("Stop the run on every node?",
                                      "Every node's processes get SIGTERM, then SIGKILL after a grace period. "
                                      "Checkpoints already written stay.", yes="Stop all", danger=True))
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=goto("f6", ask))


def test_help_panel(snap_compare, SIZE):
    async def ask(pilot) -> None:
        await pilot.press("f10")
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=goto("f4", ask))


def test_node_form_with_an_error(snap_compare, SIZE):
    async def bad_port(pilot) -> None:
        from textual.widgets import Input

        await pilot.press("a")
        await pilot.pause()
        pilot.app.screen.query_one("#f-host", Input).value = "gpu-node-9"
        pilot.app.screen.query_one("#f-port", Input).value = "99999"
        await pilot.press("ctrl+s")
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=goto("f1", bad_port))


def test_training_without_a_gpu_type(snap_compare, SIZE):
    """No probe facts and no GPU type: memory in amber, 'GPU unknown: fit not checked'."""
    async def gpu_run(pilot) -> None:
        from textual.widgets import Select

        pilot.app.state.facts = type(pilot.app.state.facts)()
        pilot.app.facts_changed()
        pilot.app.screen.query_one("#training-device", Select).value = "auto"
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=goto("f4", gpu_run))


@pytest.mark.parametrize("size", [(79, 24), (100, 20)], ids=["79x24", "100x20"])
def test_terminal_too_small(snap_compare, size):
    """Below 80x24 (either way) every step says so, with the size it has and the one it needs."""
    assert snap_compare(make_app(), terminal_size=size, run_before=goto("f4"))
