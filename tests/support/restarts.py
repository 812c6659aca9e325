"""A local run (the demo preset, two nodes on this machine) driven from outside the way the restart tests
need it: the CLI in a session of its own, the first checkpoint awaited, one node's ranks killed while the
others are held."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from support.paths import DEMO, ROOT
from support.ports import free_port
from support.procs import ranks_of_job

# The restart tests' run: long enough to kill a rank past the first checkpoint, checkpoints often.
MAX_STEPS, SAVE_STEPS = 40, 4


def preset_copy(tmp_path: Path, **training) -> Path:
    """The local demo preset with a free master port and these training values."""
    data = yaml.safe_load(DEMO.read_text())
    data["network"]["master_port"] = free_port()
    data["training"].update(training, output_dir=str(tmp_path / "out"))
    p = tmp_path / "demo.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def records(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def first_checkpoint(recs: list[dict]):
    """The first checkpoint's step once a step after it is logged (a kill then lands past a checkpoint), else None."""
    done = [r["step"] for r in recs if r.get("event") == "checkpoint"]
    steps = [r["step"] for r in recs if "loss" in r and "event" not in r]
    return done[0] if done and steps and max(steps) > done[0] else None


def cli_in(tmp_path: Path, runs: Path):
    """Starts `qwen-tui ARGS --runs-dir RUNS` from tmp_path in a session of its own, its output to `out`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}

    def cli(*args, out):
        return subprocess.Popen([sys.executable, "-m", "qwen_tui.cli", *args, "--runs-dir", str(runs)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True)
    return cli


class HoldAtFirstCheckpoint:
    """Holds a run at its first checkpoint so the caller can act there, however loaded the machine. A thread of its
    own finds node `holder`'s ranks and from then on lets them run in slices: it stops them (SIGSTOP), reads the
    run's metrics, and lets them go on (SIGCONT) for SLICE_S until the first checkpoint and a step after it are
    logged; then it keeps them stopped, and every rank waits in its next collective. The run advances only inside
    a slice, so however late this thread is scheduled it cannot miss the checkpoint: a watcher that only looked (a
    tiny run steps every few tens of ms) once found the run already finished under load. `kill(victim)` SIGKILLs
    node `victim`'s ranks and lets the held ones go on; leaving the `with` lets them go on whatever happened."""

    SLICE_S = 0.05

    def __init__(self, runs: Path, holder: str = "0"):
        self.runs, self.holder = runs, holder
        self.run_dir: Path | None = None
        self.ckpt: int | None = None
        self.held: list[int] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "HoldAtFirstCheckpoint":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        self._resume()

    @staticmethod
    def _signal(pids: list[int], sig: int) -> list[int]:
        """Signals the pids; those still there."""
        out = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                out.append(pid)
        return out

    def _watch(self) -> None:
        ranks: list[int] = []
        while not self._done.is_set():
            pids = next(iter(self.runs.glob("*/pids.json")), None) if self.runs.is_dir() else None
            if pids is not None:
                self.run_dir = pids.parent
                ranks = ranks or ranks_of_job(json.loads(pids.read_text())[self.holder])
                self.held = self._signal(ranks, signal.SIGSTOP)
                ckpt = first_checkpoint(records(self.run_dir / "metrics.jsonl"))
                if ckpt is not None:
                    self.ckpt = ckpt  # set last: a caller that sees it finds the run held
                    return
                self._resume()
                # before its ranks exist (seconds of start-up) a look costs a scan of /proc: not every 10 ms
                self._done.wait(self.SLICE_S if ranks else 0.1)
            else:
                self._done.wait(0.05)

    def _resume(self) -> None:
        self._signal(self.held, signal.SIGCONT)  # a rank that already ended has nothing to go on with
        self.held = []

    def kill(self, victim: str = "1") -> list[int]:
        """SIGKILL node `victim`'s ranks while the run is held, then let the held ranks go on. Returns the
        killed pids."""
        assert self.ckpt is not None and self.run_dir is not None, "the run is not held yet"
        assert self.held, f"node {self.holder} had no rank to hold at checkpoint {self.ckpt}"
        try:
            victims = ranks_of_job(json.loads((self.run_dir / "pids.json").read_text())[victim])
            assert victims, f"node {victim} has no rank left to kill"
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
        finally:
            self._resume()
        return victims


def wait_for_first_checkpoint(replay, hold: HoldAtFirstCheckpoint, log: Path, on_run_dir=None, bound: float = 240):
    """(run directory, first checkpoint's step) once `hold` holds the run `replay` launched, looked at every
    50 ms; `on_run_dir(rd)` is called at each look once the run directory exists."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline and hold.ckpt is None:
        assert replay.poll() is None, log.read_text()[-3000:]
        if hold.run_dir is not None and on_run_dir is not None:
            on_run_dir(hold.run_dir)
        time.sleep(0.05)
    assert hold.ckpt, log.read_text()[-3000:]
    return hold.run_dir, hold.ckpt
