"""The wizard with SLURM giving the nodes: the Nodes step switches from SSH nodes to SLURM (k) and edits what to
ask SLURM for (e), refusing a bad value next to its field; the SSH and Network steps say what SLURM does instead
of acting; the Run step shows SLURM's word on a submitted job (PENDING and its reason, then RUNNING on its nodes)
and the batch job's own lines; the preset saved is a SLURM preset that validates."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Input, Static

from qwen_tui.preset.files import load_preset
from qwen_tui.run.slurm.job import JobOutput, Queued
from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.messages import JobLines, JobQueued
from qwen_tui.ui.modals import Choose, Form

pytestmark = pytest.mark.anyio
SIZE = (160, 48)


def _text(w) -> str:
    return str(w.render())


async def test_switching_to_slurm_and_saying_what_to_ask_it_for(tmp_path, demo_copy):
    path = demo_copy()
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        await pilot.press("k")
        await pilot.pause()
        assert isinstance(app.screen, Choose)
        await pilot.press("l")  # SLURM
        await pilot.pause()
        scr = app.screen
        assert app.state.preset.scheduler.is_slurm and app.state.preset.cluster.nodes == []
        assert not scr.query_one(DataTable).display
        summary = _text(scr.query_one("#slurm-summary", Static))
        assert "SLURM gives this run its nodes" in summary and "2 node(s) x 1 process(es)" in summary
        await pilot.press("a")  # adding an SSH node makes no sense now: said, nothing changes
        await pilot.pause()
        assert app.state.preset.cluster.nodes == []
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, Form)
        form = app.screen
        form.query_one("#f-nodes", Input).value = "4"
        form.query_one("#f-partition", Input).value = "gpu"
        form.query_one("#f-time", Input).value = "90 minutes"  # not a SLURM time: refused next to the field
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, Form) and "not a SLURM time" in _text(app.screen.query_one("#form-error"))
        app.screen.query_one("#f-time", Input).value = "04:00:00"
        await pilot.press("ctrl+s")
        await pilot.pause()
        s = app.state.preset.scheduler
        assert (s.nodes, s.partition, s.time) == (4, "gpu", "04:00:00") and app.state.preset.world_size == 4
        await pilot.press("f2")  # SSH: nothing to set up, said so; its keys act on nothing
        await pilot.pause()
        assert "no SSH key is needed" in _text(app.screen.query_one("#pairs", Static))
        await pilot.press("f3")
        await pilot.pause()
        assert "checked through srun inside the batch job" in _text(app.screen.query_one("#net-findings", Static))
        await pilot.press("ctrl+s")
        await pilot.pause()
    saved = load_preset(path)
    assert saved.scheduler.is_slurm and saved.scheduler.nodes == 4 and saved.scheduler.partition == "gpu"
    assert saved.cluster.nodes == []


async def test_the_run_step_shows_slurms_word_on_the_job_and_its_output(tmp_path, demo_copy):
    path = demo_copy()
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1", "k", "l")
        await pilot.pause()
        await pilot.press("f6")
        await pilot.pause()
        run = app.screen
        run.post_message(JobQueued(Queued("4242", "PENDING", "QOSMaxGRESPerUser", "2026-12-05T09:00:00")))
        await pilot.pause()
        status = _text(run.query_one("#run-status", Static))
        assert "job 4242 PENDING (QOSMaxGRESPerUser)" in status and "expects it to start 2026-12-05T09:00:00" in status
        assert app.state.run_status == "pending"
        run.post_message(JobQueued(Queued("4242", "RUNNING", "", "", ("gpu7", "gpu9"))))
        run.post_message(JobLines(JobOutput(("inside SLURM job 4242: 2 node(s), gpu7, gpu9",)).lines))
        await pilot.pause()
        assert "job 4242 RUNNING on 2 node(s): gpu7, gpu9" in _text(run.query_one("#run-status", Static))
        assert "inside SLURM job 4242" in _text(run.query_one("#log-text", Static))
