"""The wizard's Run step on a real SLURM: a run launched from the wizard is submitted, shows PENDING with SLURM's
reason while another job holds every node, and the step's stop cancels the job (scancel): SLURM's record says
CANCELLED, and so does the wizard."""

from __future__ import annotations

import re
import sys

import pytest
from textual.widgets import Static

from qwen_tui.preset.files import save_preset
from qwen_tui.preset.schema import Preset
from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.modals import Confirm
from support.pilot import wait_until

pytestmark = pytest.mark.anyio


async def test_a_wizard_launch_pends_with_slurms_reason_and_its_stop_cancels_the_job(slurm, tmp_path, monkeypatch):
    for k, v in slurm.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    path = tmp_path / "slurm.yaml"
    save_preset(Preset.model_validate({
        "name": "wizard-slurm",
        "scheduler": {"kind": "slurm", "nodes": 3, "cpus_per_node": 1, "workdir": str(tmp_path),
                      "python": sys.executable},
        "cluster": {"shared_storage": True},
        "network": {"backend": "gloo", "master_port": 29543},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "device": "cpu", "precision": "fp32",
                     "zero_stage": None, "max_steps": 2, "output_dir": str(tmp_path / "out")}}), path)
    blocker = slurm.client("sbatch", "--parsable", "-N3", "--exclusive", "--output=/dev/null", "--wrap",
                           "sleep 600").stdout.strip()  # no slurm-N.out in the cwd
    try:
        app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.press("f6")
            await pilot.pause()
            await pilot.press("l")
            status = app.screen.query_one("#run-status", Static)
            line = await wait_until(pilot, lambda: re.search(r"job (\d+) PENDING \((Resources|Priority)\)",
                                                             str(status.render())), 60, "PENDING with its reason")
            job = line.group(1)
            assert app.state.run_status == "pending"
            await pilot.press("s")
            await wait_until(pilot, lambda: isinstance(app.screen, Confirm), 10, "the cancel question")
            await pilot.press("enter")
            await wait_until(pilot, lambda: "CANCELLED" in str(status.render()), 60, "the job cancelled")
            assert app.state.run_status == "stopped"
        assert "JobState=CANCELLED" in slurm.completion(job)
    finally:
        slurm.client("scancel", blocker, check=False)
