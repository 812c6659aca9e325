"""Startup time of the wizard: from process start to the first screen painted.

Each repetition is a fresh `python -c` process that imports the app, runs it headless
and exits on its first screen's first refresh. Beside it, interleaved so both see the
same load, a reference process paints an empty Textual App: what any Textual program
pays on this machine right now. The report gives the median of 7 of each, the wizard's
extra over the reference, and the machine's load (1-minute load average per core),
so a figure taken on a busy shared machine says so.

An idle reference: `--record-idle` stores the medians in bench/results/startup_idle.json
when the machine is idle (load under 0.25 per core; refused otherwise); later reports
print it beside the figure under the current load.

    python bench/startup_time.py [--runs 7] [--json] [--record-idle]

It fails when the UI process imported torch, transformers, deepspeed or peft.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IDLE_FILE = ROOT / "bench" / "results" / "startup_idle.json"
IDLE_LOAD_PER_CORE = 0.25
HEAVY = ("torch", "transformers", "deepspeed", "peft")

WIZARD = r"""
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
print(json.dumps({"seconds": app.painted - t0, "heavy": sorted(m for m in HEAVY if m in sys.modules)}))
"""

REFERENCE = r"""
import sys, time, json
t0 = float(sys.argv[1])
from textual.app import App
from textual.widgets import Footer, Static

class Once(App):
    def compose(self):
        yield Static("reference")
        yield Footer()
    def on_ready(self):
        self.call_after_refresh(self._painted)
    def _painted(self):
        self.painted = time.time()
        self.exit(0)

app = Once()
app.run(headless=True, size=(140, 44))
print(json.dumps({"seconds": app.painted - t0, "heavy": []}))
"""


def _once(code: str) -> dict:
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n" + code, repr(t0)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def load_per_core() -> float:
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def measure(runs: int) -> dict:
    load_before = load_per_core()
    wizard, reference = [], []
    for _ in range(runs):  # interleaved: a burst of load hits both sides alike
        out = _once(WIZARD)
        if out["heavy"]:
            raise RuntimeError(f"the UI process imported {out['heavy']}")
        wizard.append(out["seconds"])
        reference.append(_once(REFERENCE)["seconds"])
    med_w, med_r = round(statistics.median(wizard) * 1000), round(statistics.median(reference) * 1000)
    return {"runs": runs, "wizard_ms": med_w, "reference_ms": med_r, "extra_ms": med_w - med_r,
            "wizard_min_ms": round(min(wizard) * 1000),
            "wizard_max_ms": round(max(wizard) * 1000), "cores": os.cpu_count(),
            "load_per_core": round(max(load_before, load_per_core()), 2),
            "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}


def report(m: dict, idle) -> str:
    lines = [f"first paint: wizard median {m['wizard_ms']} ms (min {m['wizard_min_ms']}, max {m['wizard_max_ms']}, "
             f"{m['runs']} runs); an empty Textual app {m['reference_ms']} ms at the same time: the wizard's "
             f"extra {m['extra_ms']} ms",
             f"machine: {m['cores']} cores, load {m['load_per_core']} per core "
             f"({'idle' if m['load_per_core'] < IDLE_LOAD_PER_CORE else 'busy'}); "
             "no torch/transformers/deepspeed/peft import"]
    if idle:
        lines.append(f"idle reference ({idle['when']} UTC, load {idle['load_per_core']} per core): wizard "
                     f"{idle['wizard_ms']} ms, empty app {idle['reference_ms']} ms")
    else:
        lines.append(f"idle reference: none recorded yet (--record-idle on an idle machine writes "
                     f"{IDLE_FILE.relative_to(ROOT)})")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="wizard startup to first paint, beside an empty Textual app")
    ap.add_argument("--runs", type=int, default=7, help="processes of each kind (default 7; the median is reported)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--record-idle", action="store_true",
                    help=f"store the figures as the idle reference (refused above {IDLE_LOAD_PER_CORE} load per core)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    try:
        m = measure(args.runs)
    except RuntimeError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    idle = json.loads(IDLE_FILE.read_text()) if IDLE_FILE.exists() else None
    if args.record_idle:
        if m["load_per_core"] >= IDLE_LOAD_PER_CORE:
            print(f"not recorded as idle: load {m['load_per_core']} per core (want < {IDLE_LOAD_PER_CORE})",
                  file=sys.stderr)
            return 2
        IDLE_FILE.parent.mkdir(parents=True, exist_ok=True)
        tmp = IDLE_FILE.with_suffix(".tmp")
        tmp.write_text(json.dumps(m, indent=2) + "\n")
        tmp.replace(IDLE_FILE)
        idle = m
    print(json.dumps({**m, "idle": idle}, indent=2) if args.json else report(m, idle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
