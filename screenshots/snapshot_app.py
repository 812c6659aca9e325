"""A deterministic wizard for the screenshots (make_screenshots.py) and the snapshot tests (tests/ui): the
local-demo preset, fixed facts (two H200 nodes, a measured 6.2 Gbit/s link), a fixed base directory and Python,
no re-attach, and a synthetic run on the Run screen (metrics and samples shaped
like the real ones: the H200 nvidia-smi fixture, the worker's metrics lines)."""

from __future__ import annotations

import math
from pathlib import Path

from qwen_tui.cluster.facts import GPU, ClusterFacts, LinkFacts, NodeFacts
from qwen_tui.run.watch.gpumon import GpuSample, NodeSample
from qwen_tui.run.watch.metrics import TrainingProgress
from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.messages import GpuSampleMsg, RunUpdate

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "presets" / "local-demo.yaml"


def fixed_facts() -> ClusterFacts:
    def node(i: int) -> NodeFacts:
        return NodeFacts(hostname=f"gpu-node-{i}", addresses={"eth0": [f"10.0.0.{i + 1}"]}, route_interface="eth0",
                         gpus=[GPU(index=0, name="NVIDIA H200", memory_total_mib=143771)], driver_version="580.159.04",
                         cuda_version="13.0", cpu_count=16, python_version="3.11.2",
                         versions={"torch": "2.11.0", "transformers": "5.17.0"}, training_importable=True)
    return ClusterFacts(nodes={0: node(0), 1: node(1)},
                        links={1: LinkFacts(port_reachable=True, bandwidth_gbps=6.2)}, master_port_free=True)


def make_app(**kw) -> WizardApp:
    app = WizardApp(str(DEMO.relative_to(ROOT)) if Path.cwd() == ROOT else str(DEMO), facts=fixed_facts(),
                    runs_root="/nonexistent/runs", reattach=False, base_dir="/srv/qwen",
                    local_python="/srv/qwen/.venv/bin/python", **kw)
    app.state.path = Path("presets/local-demo.yaml")  # the same title wherever the tests run
    for i in range(2):
        app.state.node(i).probe = "ok"
    app.state.net_checked = True
    return app


def synthetic_progress(steps: int = 40, total: int = 60) -> TrainingProgress:
    p = TrainingProgress(start={"event": "start", "total_steps": total})
    for s in range(1, steps + 1):
        p.steps.append({"step": s, "loss": 7.9 * math.exp(-s / 14) + 0.45 + 0.08 * math.sin(s),
                        "learning_rate": 2e-3 * min(1.0, s / 3) * (0.5 + 0.5 * math.cos(math.pi * s / total)),
                        "tokens_per_second": 3900.0, "time": 1000.0 + 0.42 * s})
        if s % 10 == 0:  # eval_steps 10, as the worker writes them
            p.events.append({"event": "eval", "step": s, "eval_loss": 7.9 * math.exp(-s / 16) + 0.6,
                             "eval_tokens": 6538})
    return p


async def show_synthetic_run(app: WizardApp) -> None:
    """Fill the Run screen as a running job would (no processes, no clock)."""
    from qwen_tui.run.api import Snapshot

    run = app.get_screen("run")
    app.state.run_status = "running"
    await run.show_panels([(0, "localhost"), (1, "localhost")])
    app.facts_changed()  # as a real start does: the bar marks the Run step as running

    def later() -> None:
        from rich.text import Text

        run._status(Text("running · 2 nodes · world size 2 · run dir runs/20261129-151500-local-demo", style="green"))
        log = [f"[rank 0] INFO step {s}/60 loss {7.9 * math.exp(-s / 14) + 0.45:.4f} lr 0.00190 3900 tok/s"
               for s in range(25, 41)]
        run.post_message(RunUpdate(Snapshot(nodes={0: ("running", None), 1: ("running", None)},
                                            progress=synthetic_progress(), log=log, log_rank=0)))
        run.post_message(GpuSampleMsg(NodeSample(rank=0, gpus=[GpuSample(0, "NVIDIA H200", 100, 1139, 143771)])))
        run.post_message(GpuSampleMsg(NodeSample(rank=1, gpus=[GpuSample(0, "NVIDIA H200", 97, 1139, 143771)])))

    app.call_after_refresh(later)
