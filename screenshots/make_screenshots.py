"""Regenerate screenshots/: one SVG + PNG per wizard screen, from the real app
driven by Pilot with the deterministic facts the snapshot tests use.

    python screenshots/make_screenshots.py        (PNG needs cairosvg or rsvg-convert)
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "screenshots"
sys.path.insert(0, str(ROOT))  # qwen_tui from this checkout; snapshot_app sits beside this script
os.chdir(ROOT)

from snapshot_app import make_app, show_synthetic_run  # noqa: E402

SIZE = (140, 44)
SHOTS = [("1-nodes", "f1"), ("2-ssh", "f2"), ("3-network", "f3"), ("4-training", "f4"), ("5-review", "f5"),
         ("6-run", "f6"), ("7-run-checks", "f6"), ("8-slurm-nodes", "f1"), ("9-run-slurm-pending", "f6")]


def to_png(svg: Path) -> Path:
    png = svg.with_suffix(".png")
    try:
        import cairosvg
    except ImportError:
        if not shutil.which("rsvg-convert"):
            raise SystemExit("PNG needs `pip install cairosvg` or rsvg-convert (librsvg2-bin)") from None
        subprocess.run(["rsvg-convert", "-w", "1600", "-o", str(png), str(svg)], check=True)
    else:
        cairosvg.svg2png(url=str(svg), write_to=str(png), output_width=1600)
    return png


async def show_checks(app) -> None:
    """The Run screen while a launch's checks run, from the events the launch API yields (no processes)."""
    from qwen_tui.run.api import CheckProgress, Stage
    from qwen_tui.ui.messages import LaunchEvent

    run = app.get_screen("run")
    app.state.run_status = "starting"
    for ev in [Stage("check", "checking the nodes (probe, ports, firewall, bandwidth)…"),
               CheckProgress("probe", None, "probing 2 node(s): Python stack, GPUs, data, disk"),
               CheckProgress("probe", 0, "probed"), CheckProgress("probe", 1, "probed"),
               CheckProgress("port", None, "master port 29500: can every node reach node 0?"),
               CheckProgress("port", 0, "the master port is free"), CheckProgress("port", 1, "reaches the master port"),
               CheckProgress("bandwidth", None, "iperf3 from each node to node 0 (2 s each)"),
               CheckProgress("bandwidth", 1, "94.1 Gbit/s")]:
        run.post_message(LaunchEvent(ev))


def as_slurm(app) -> None:
    """The demo preset with SLURM giving its nodes: what a user asks for on a GPU cluster."""
    from qwen_tui.ui.screens.slurm_nodes import to_slurm

    p = app.state.preset
    app.set_preset(p.with_changes({**to_slurm(p), "scheduler.nodes": 4, "scheduler.gpus_per_node": 8,
                                   "scheduler.partition": "gpu", "scheduler.account": "llm-team",
                                   "scheduler.time": "12:00:00", "scheduler.workdir": "/shared/qwen",
                                   "scheduler.python": "/shared/qwen/.venv/bin/python"}))


async def show_pending(app) -> None:
    """The Run screen of a submitted SLURM job while it waits, then its first lines (no SLURM needed)."""
    from qwen_tui.run.slurm.job import Queued
    from qwen_tui.ui.messages import JobLines, JobQueued

    run = app.get_screen("run")
    run.post_message(JobQueued(Queued("81234", "PENDING", "Priority", "2026-12-05T02:40:00")))
    run.post_message(JobLines(("submitted SLURM job 81234: 4 node(s); run directory "
                               "/shared/qwen/runs/20261205-021500-local-demo",)))


async def shoot(name: str, key: str) -> Path:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        if "slurm" in name:
            as_slurm(app)
            await pilot.pause()
        await pilot.press(key)
        await pilot.pause()
        if name == "9-run-slurm-pending":
            await show_pending(app)
        if name == "4-training":  # show the live advice reacting: GPU bf16 run, ZeRO-3 on a 6 Gbit/s link
            from textual.widgets import Select

            scr = app.screen
            scr.query_one("#training-device", Select).value = "auto"
            scr.query_one("#training-precision", Select).value = "bf16"
            await pilot.pause()
            scr.query_one("#training-zero_stage", Select).value = 3
        if name == "6-run":
            await show_synthetic_run(app)
        if name == "7-run-checks":  # a launch's checks under way: the check, and each node's answers so far
            await show_checks(app)
        await pilot.pause(0.5)
        from textual.widgets import Input

        for field in app.screen.query(Input):  # a steady cursor: the same picture whatever the blink's phase
            field.cursor_blink = False
        await pilot.pause()
        svg = OUT / f"{name}.svg"
        app.save_screenshot(filename=svg.name, path=str(OUT))
    return svg


async def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, key in SHOTS:
        svg = await shoot(name, key)
        print(f"wrote {svg.relative_to(ROOT)} and {to_png(svg).relative_to(ROOT)}")


if __name__ == "__main__":
    asyncio.run(main())
