"""Startup time of the wizard: from process start to the first screen painted.

Each repetition is a fresh `python -c` process that imports the app, runs it
headless and exits on its first screen's first refresh; the figure is the median
wall time over the runs. It also checks that torch, transformers and deepspeed were
never imported.

    python bench/startup_time.py [--runs 9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import sys, time, json
t0 = float(sys.argv[1])
from qwen_tui.ui.app import WizardApp

class Once(WizardApp):
    def on_ready(self):  # Textual's Ready: the first screen is composed; the next refresh paints it
        self.call_after_refresh(self._painted)
    def _painted(self):
        self.painted = time.time()
        self.exit(0)

app = Once("presets/local-demo.yaml", reattach=False)
app.run(headless=True, size=(140, 44))
heavy = sorted(m for m in ("torch", "transformers", "deepspeed") if m in sys.modules)
print(json.dumps({"seconds": app.painted - t0, "heavy": heavy}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    times = []
    for _ in range(args.runs):
        t0 = time.time()
        r = subprocess.run([sys.executable, "-c", CHILD, repr(t0)], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
        if r.returncode != 0:
            print(r.stderr[-2000:], file=sys.stderr)
            return 1
        out = json.loads(r.stdout.strip().splitlines()[-1])
        if out["heavy"]:
            print(f"FAIL: the UI process imported {out['heavy']}", file=sys.stderr)
            return 1
        times.append(out["seconds"])
    print(f"startup to first paint: median {statistics.median(times) * 1000:.0f} ms "
          f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}, {len(times)} runs); "
          f"no torch/transformers/deepspeed import")
    return 0


if __name__ == "__main__":
    sys.exit(main())
