"""A hung run on the Run screen, for real (the local demo, two torchrun agents, the tiny model; one rank stopped with
SIGSTOP): the node that holds the run is marked on its panel (HUNG, its border) and the ETA says unknown; the
newest notice is the first line of the notice box; k shows the stacks the hang collected (the stopped rank's read by
py-spy); once the rank runs again the mark goes and "no longer hung" is on top; and a stop asked for from another
terminal (`qwen-tui attach --stop`) ends the run here as stopped, never failed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from textual.widgets import Static

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.modals import Notice
from qwen_tui.ui.widgets.gpu_panel import GpuPanel
from qwen_tui.ui.widgets.loss_chart import LossChart
from support.paths import ROOT
from support.pilot import SIZE, wait_until
from support.procs import ranks_of_job

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _notices(run) -> list[str]:
    return str(run.query_one("#run-notices", Static).render()).splitlines()


async def test_the_hung_node_is_marked_the_newest_notice_is_on_top_and_a_stop_elsewhere_is_a_stop(
        tmp_path, demo_copy, monkeypatch, stop_runs_after):
    preset = demo_copy(monitor={"hang_timeout": 10, "on_hang": "alert"}, max_steps=100000, save_strategy="no")
    runs = tmp_path / "runs"
    stop_runs_after(runs)
    monkeypatch.chdir(tmp_path)
    app = WizardApp(str(preset), runs_root=str(runs), reattach=False)
    held: list[int] = []
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f6")
        await pilot.pause()
        await pilot.press("l")
        run = app.get_screen("run")
        await wait_until(pilot, lambda: run.launcher is not None or app.state.run_status == "failed", 90, "launch")
        await wait_until(pilot, lambda: run.last_snapshot and len(run.last_snapshot.progress.steps) >= 3, 180,
                         "three steps")
        try:
            held = ranks_of_job(json.loads((run.launcher.run_dir.path / "pids.json").read_text())["1"])
            for pid in held:
                os.kill(pid, signal.SIGSTOP)
            await wait_until(pilot, lambda: run.last_snapshot.hung == 1, 120, "the hang called on node 1")
            await pilot.pause(0.5)
            panel = run.query_one("#gpu-1", GpuPanel)
            assert panel.has_class("-hung") and not run.query_one("#gpu-0", GpuPanel).has_class("-hung")
            assert panel.note.startswith("HUNG: rank 1 holds the run"), panel.note
            assert _notices(run)[0].startswith("HANG:"), _notices(run)
            assert "ETA unknown (hung)" in run.query_one(LossChart).summary

            await pilot.press("k")
            await wait_until(pilot, lambda: isinstance(app.screen, Notice), 10, "the stacks window")
            body = str(app.screen.query_one(".dialog-body", Static).render())
            assert "rank 1: ok (py-spy)" in body and "localhost-rank1.txt" in body, body[:2000]
            await pilot.press("escape")

            for pid in held:
                os.kill(pid, signal.SIGCONT)
            held = []
            await wait_until(pilot, lambda: run.last_snapshot.hung is None and not panel.has_class("-hung"), 60,
                             "the mark gone")
            await wait_until(pilot, lambda: "no longer hung" in _notices(run)[0], 30, "the end of the hang on top")
        finally:
            for pid in held:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

        stop = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "attach", str(run.launcher.run_dir.path),
                               "--stop"], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                              text=True, timeout=120)
        assert stop.returncode in (0, 130), stop.stdout[-2000:] + stop.stderr[-2000:]
        await wait_until(pilot, lambda: app.state.run_status in ("stopped", "failed"), 90, "the run to end")
        status = str(run.query_one("#run-status", Static).render())
        assert app.state.run_status == "stopped" and status.startswith("stopped"), status
