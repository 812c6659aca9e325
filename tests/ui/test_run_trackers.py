"""The wizard's Run screen with training.report_to: the demo's two local CPU nodes train, and the TensorBoard
event file rank 0 writes holds the loss and both nodes' load as the Run screen's monitor saw it."""

from __future__ import annotations

import glob

import pytest

from qwen_tui.ui.app import WizardApp
from support.pilot import SIZE, wait_until
from support.procs import run_processes

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_run_screen_hands_every_nodes_load_to_tensorboard(tmp_path, demo_copy, monkeypatch, stop_runs_after):
    preset = demo_copy(max_steps=16, logging_steps=1, save_strategy="no", report_to=["tensorboard"])
    runs = tmp_path / "runs"
    stop_runs_after(runs)
    monkeypatch.chdir(tmp_path)
    app = WizardApp(str(preset), runs_root=str(runs), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f5")
        await pilot.pause()
        await pilot.press("l")
        if app.screen.is_modal:
            await pilot.press("y")
        run = app.get_screen("run")
        await wait_until(pilot, lambda: app.state.run_status in ("ok", "failed", "stopped"), 300, "the run's end")
        assert app.state.run_status == "ok", str(run.query_one("#run-status").render())
        run_id = run.launcher.plan.run_id
        assert (runs / run_id / "gpus.jsonl").stat().st_size > 0  # the monitor's series, beside metrics.jsonl
        assert (runs / run_id / "gpus.jsonl").stat().st_mode & 0o077 == 0  # 0600, as the run directory's files
        await pilot.press("ctrl+q")
    assert run_processes(run_id) == []

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (event_file,) = glob.glob(str(tmp_path / "out" / "runs" / "*" / "events.out.tfevents.*"))
    ea = EventAccumulator(event_file)
    ea.Reload()
    tags = ea.Tags()["scalars"]
    assert "train/loss" in tags and {"cpu/node0/util", "cpu/node1/util"} <= set(tags), tags
    steps = {e.step for e in ea.Scalars("train/loss")}
    assert all(e.step in steps for e in ea.Scalars("cpu/node1/util"))
