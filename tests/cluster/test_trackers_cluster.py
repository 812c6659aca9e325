"""--report_to on the namespace cluster: three CPU nodes trained over SSH and followed by the headless face; the
TensorBoard event file that rank 0 writes on node 0 holds the loss and every node's load as qwen-tui's monitor
saw it (run.watch.gpuseries -> gpus.jsonl on the master -> training.runtime.trackers)."""

from __future__ import annotations

import glob
import io
import os
import shutil

import pytest
from rich.console import Console

from qwen_tui.cli.live import follow
from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.schema import Preset
from qwen_tui.run.launcher import Launcher
from qwen_tui.run.rundir import RunDir
from support.cluster import preset_dict

pytestmark = pytest.mark.cluster


def test_tensorboard_on_node0_holds_the_loss_and_every_nodes_load(cluster, sshdir, keyed, tmp_path):
    out_dir = tmp_path / "out"
    d = preset_dict(cluster, sshdir, output_dir=str(out_dir), max_steps=14, learning_rate=5e-3,
                    report_to="tensorboard")
    d["network"]["env"] = {"OMP_NUM_THREADS": "1"}  # three CPU "nodes" share two cores
    d["cluster"]["shared_storage"] = True  # the namespaces share this machine's disk
    preset = Preset.model_validate(d)
    conns = connect_all(preset)
    assert conns.ok, conns.errors_text()
    name = f"trackers-{os.getpid()}"
    rd = RunDir.create(tmp_path / "runs", name)
    plan = make_plan(preset, run_id=name, local_run_dir=str(rd.path))
    la = Launcher(plan, dict(conns), rd, stop_grace=5)
    try:
        la.start()
        outcome = follow(la, Console(file=io.StringIO(), width=120), interval=0.5, max_seconds=300)
        assert outcome.status == "ok", (outcome.message, [la.log_tail(r) for r in range(3)])
        series = os.path.join(os.path.dirname(plan.metrics_file), "gpus.jsonl")
        assert os.path.getsize(series) > 0  # the monitor's lines reached the master node

        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        (event_file,) = glob.glob(str(out_dir / "runs" / "*" / "events.out.tfevents.*"))
        ea = EventAccumulator(event_file)
        ea.Reload()
        tags = ea.Tags()["scalars"]
        loss = {e.step: e.value for e in ea.Scalars("train/loss")}
        assert sorted(loss) == list(range(1, 15))
        assert {f"cpu/node{r}/util" for r in range(3)} <= set(tags), tags  # all three nodes, beside the loss
        for r in range(3):
            values = ea.Scalars(f"cpu/node{r}/util")
            assert all(0.0 <= e.value <= 100.0 and e.step in loss for e in values)
    finally:
        la.stop_all()
        close_all(conns)
        shutil.rmtree(os.path.dirname(la.plan.metrics_file), ignore_errors=True)
