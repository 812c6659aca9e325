"""The Run screen renders the launch API's Failure: a check error (the master port is taken)
stops the launch before anything starts, the status line and a modal say the cause and the
fix, and no run directory is made. The launch worker only posts what run.api yields."""

from __future__ import annotations

import socket

import pytest
import yaml
from textual.widgets import Static

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.modals import Notice
from support.pilot import SIZE, wait_until

pytestmark = [pytest.mark.anyio]


async def test_a_check_error_shows_its_cause_and_fix_and_starts_nothing(tmp_path, demo_copy, monkeypatch):
    preset = demo_copy(max_steps=4)
    port = yaml.safe_load(preset.read_text())["network"]["master_port"]
    busy = socket.socket()
    busy.bind(("", port))
    busy.listen()
    monkeypatch.chdir(tmp_path)
    app = WizardApp(str(preset), runs_root=str(tmp_path / "runs"), reattach=False)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("f6")
            await pilot.pause()
            await pilot.press("l")
            await wait_until(pilot, lambda: isinstance(app.screen, Notice), 60, "the failure modal")
            body = str(app.screen.query_one(".dialog-body", Static).render())
            assert f"PORT_IN_USE: master port {port} is already in use on node 0" in body, body
            assert "fix: " in body
            assert app.state.run_status == "failed"
            await pilot.press("enter")
            await pilot.pause()
            run = app.get_screen("run")
            assert run.launcher is None
            assert "not launched: 1 error(s) in the checks" in str(run.query_one("#run-status", Static).render())
    finally:
        busy.close()
    assert not (tmp_path / "runs").exists()
