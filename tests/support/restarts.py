"""A local run (the demo preset, two nodes on this machine) driven from outside the way the restart tests
need it: the CLI in a session of its own, the first checkpoint awaited, one node's ranks killed while the
others are held."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


def wait_for_first_checkpoint(replay, runs: Path, log: Path, on_run_dir=None, bound: float = 240):
    """(run directory, first checkpoint's step) of the run `replay` launched, polled every 50 ms;
    `on_run_dir(rd)` is called at each look once the run directory exists."""
    deadline = time.monotonic() + bound
    rd, ckpt = None, None
    while time.monotonic() < deadline and ckpt is None:
        assert replay.poll() is None, log.read_text()[-3000:]
        pids = next(iter(runs.glob("*/pids.json")), None) if runs.is_dir() else None
        if pids is not None:
            rd = pids.parent
            ckpt = first_checkpoint(records(rd / "metrics.jsonl"))
            if on_run_dir is not None:
                on_run_dir(rd)
        time.sleep(0.05)
    assert ckpt, log.read_text()[-3000:]
    return rd, ckpt


def kill_ranks_holding_the_run(pids: dict, victim: str, holder: str = "0") -> list[int]:
    """SIGKILL node `victim`'s ranks while node `holder`'s are stopped (SIGSTOP), then let those go on: a tiny run
    steps every few tens of ms, and with the run held the kill lands where the caller saw it, not after the
    victim's ranks have already finished. Returns the killed pids."""
    held = ranks_of_job(pids[holder])
    assert held, f"node {holder} has no rank to hold"
    try:
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        victims = ranks_of_job(pids[victim])
        assert victims, f"node {victim} has no rank left to kill"
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
    finally:
        for pid in held:
            os.kill(pid, signal.SIGCONT)
    return victims
