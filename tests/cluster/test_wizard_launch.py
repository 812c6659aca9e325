"""The wizard's main path on the namespace cluster, as a user takes it: Review (F5), l to launch. Every node,
the master too, is reached over SSH. While the launch checks run (probe, ports, firewall, bandwidth, the
rehearsal) the Run screen's status line says which check and which node it is on. The screen then follows
the run to its end: one panel per node, the master's loss, and the outcome. Mid-run, SSH to node 1 is cut
(port 22 only) for a while: its panel says unreachable, the notices above the log say so and then that it is
back, and the run goes on to its end."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from qwen_tui.preset.files import save_preset
from qwen_tui.preset.schema import Preset
from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.widgets.gpu_panel import GpuPanel
from support.cluster import REPO, preset_dict

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_a_launch_from_the_wizard_over_ssh_says_where_the_checks_are_and_runs_to_the_end(
        cluster, sshdir, keyed, tmp_path):
    d = preset_dict(cluster, sshdir, output_dir=str(tmp_path / "out"), max_steps=120, logging_steps=1)
    d["name"] = "wizard-ssh"
    d["network"]["env"] = {"OMP_NUM_THREADS": "1"}  # three CPU "nodes" share two cores
    d["cluster"]["shared_storage"] = True  # the nodes' workdirs are the host's: the checks would say so
    path = tmp_path / "wizard-ssh.yaml"
    save_preset(Preset.model_validate(d), path)
    runs = tmp_path / "runs"
    app = WizardApp(str(path), reattach=False, base_dir=str(REPO), runs_root=str(runs))
    statuses: list[str] = []
    node1: list[str] = []  # node 1's panel status, as it changes
    cut = mended = None
    run = None
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.press("f5")
            await pilot.pause()
            await pilot.press("l")
            await pilot.pause()
            assert not app.screen.is_modal, "the healthy cluster's checks found errors before the launch"
            run = app.get_screen("run")
            deadline = time.monotonic() + 300
            while app.state.run_status not in ("ok", "failed", "stopped") and time.monotonic() < deadline:
                text = str(run.query_one("#run-status").render())
                if not statuses or statuses[-1] != text:
                    statuses.append(text)
                panel = next((p for p in run.query(GpuPanel) if p.rank == 1), None)
                if panel is not None and (not node1 or node1[-1] != panel.status):
                    node1.append(panel.status)
                snap = run.last_snapshot
                if cut is None and snap is not None and snap.progress.steps and snap.progress.steps[-1]["step"] >= 3:
                    cluster.ns(1, "iptables", "-I", "INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP")
                    cut = time.monotonic()
                if cut is not None and mended is None and ("unreachable" in node1 or time.monotonic() - cut > 30):
                    cluster.reset_firewall(1)
                    mended = time.monotonic()
                await pilot.pause(0.05)
            assert app.state.run_status == "ok", statuses[-5:]
            assert cut is not None, "the run ended before step 3 was seen"
            assert "unreachable" in node1, node1
            notices = str(run.query_one("#run-notices").render())
            assert "node 1 (node1) unreachable" in notices and "node 1 (node1) reachable again" in notices, notices
            checking = [s for s in statuses if s.startswith("checking · ")]
            # each node's answers so far, under the check under way: node 1 was probed while a later check ran
            assert any("\nnode 1 (node1): probed" in s and not s.startswith("checking · probe") for s in checking), \
                "\n".join(statuses)
            assert any(s.startswith("checking · rehearsal") for s in checking), statuses
            assert run.outcome.status == "ok"
            assert [p.rank for p in run.query(GpuPanel)] == [0, 1, 2]
            steps = run.last_snapshot.progress.steps
            assert [s["step"] for s in steps] == list(range(1, 121)), steps[-3:]
            assert steps[-1]["loss"] < steps[0]["loss"], steps
            await pilot.press("ctrl+q")
        rd = run.launcher.run_dir.path
        assert json.loads((rd / "state.json").read_text())["status"] == "ok"
        assert (rd / "metrics.jsonl").is_file()  # the remote master's metrics, kept as they were read
        # the nodes' agents and job shells end on their own after the last step: give them a bound, then name them
        deadline = time.monotonic() + 30
        while any(cluster.job_pids(i) for i in range(3)) and time.monotonic() < deadline:
            time.sleep(0.3)
        left = {i: [Path(f"/proc/{p}/cmdline").read_bytes()[:120] for p in cluster.job_pids(i)] for i in range(3)}
        assert not any(left.values()), left
    finally:
        cluster.reset_firewall(1)
        if run is not None and run.launcher is not None:
            if run.launcher.poll() is None:
                run.launcher.stop_all()
            shutil.rmtree(REPO / ".qwen-tui" / "runs" / run.launcher.run_dir.path.name, ignore_errors=True)
