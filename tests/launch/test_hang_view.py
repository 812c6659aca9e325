"""A hung local run as a user sees it (the demo preset on a port of its own, two nodes on this machine): one rank is
stopped (SIGSTOP) while `qwen-tui replay` follows the run. The HANG notice names that node and rank; the stopped
rank's own stack is read with py-spy (the `debug` extra; the dev extra installs it); the summary is true for every
rank; once the rank runs again the run says it is no longer hung; and a stop asked for from another terminal
(`qwen-tui attach --stop`) leaves the run stopped in replay, in its state and in `qwen-tui runs`, never failed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from support.paths import DEMO, ROOT
from support.ports import free_port
from support.procs import ranks_of_job
from support.restarts import records

pytestmark = pytest.mark.slow


def _wait(what: str, cond, bound: float, proc, log):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        assert proc.poll() is None, f"replay ended before {what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {bound:g} s:\n{log.read_text()[-3000:]}")


def test_a_stopped_ranks_stack_is_read_the_hang_ends_and_a_stop_from_another_terminal_is_a_stop(tmp_path):
    data = yaml.safe_load(DEMO.read_text())
    data["network"]["master_port"] = free_port()
    data["training"].update(output_dir=str(tmp_path / "out"), max_steps=100000, save_strategy="no")
    data["monitor"] = {"hang_timeout": 10, "on_hang": "alert"}
    preset = tmp_path / "demo.yaml"
    preset.write_text(yaml.safe_dump(data))
    runs, log = tmp_path / "runs", tmp_path / "replay.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250"}

    def cli(*args, **kw):
        return subprocess.Popen([sys.executable, "-m", "qwen_tui.cli", *args, "--runs-dir", str(runs)],
                                env=env, cwd=tmp_path, start_new_session=True, **kw)

    with open(log, "wb") as out:
        replay = cli("replay", str(preset), "--skip-checks", stdout=out, stderr=subprocess.STDOUT)
    held: list[int] = []
    try:
        rd = _wait("the run directory", lambda: next(iter(runs.glob("*/pids.json")), None), 120, replay, log).parent
        _wait("three steps", lambda: sum(1 for r in records(rd / "metrics.jsonl") if "loss" in r) >= 3, 240,
              replay, log)
        held = ranks_of_job(json.loads((rd / "pids.json").read_text())["1"])
        assert held, "node 1 has no rank"
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        _wait("a HANG notice", lambda: "HANG:" in log.read_text(), 120, replay, log)
        text = " ".join(log.read_text().split())
        hang = text[text.index("HANG:"):]
        assert "node 1 (localhost), rank 1," in hang and "heartbeat stopped" in hang, hang[:800]
        (stacks,) = sorted((rd / "stacks").glob("attempt-1-step-*"))
        summary = json.loads((stacks / "summary.json").read_text())
        # each node's ranks are its own (both nodes share one heartbeat directory): rank 0 is alive and answered,
        # rank 1 is stopped, and py-spy read it all the same
        assert set(summary) == {"0", "1"} and summary["1"] == "ok (py-spy)", summary
        assert summary["0"].startswith("ok"), summary
        stopped = (stacks / "localhost-rank1.txt").read_text()
        assert "by py-spy" in stopped and ("step_loop.py" in stopped or "finetune.py" in stopped), stopped[:2000]

        for pid in held:
            os.kill(pid, signal.SIGCONT)
        held = []
        _wait("the end of the hang", lambda: "no longer hung" in log.read_text(), 120, replay, log)

        stop = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "attach", str(rd), "--stop"], env=env,
                              capture_output=True, text=True, timeout=120)
        assert "stopped by the user" in stop.stdout, stop.stdout[-2000:] + stop.stderr[-2000:]
        rc = replay.wait(120)
        said = log.read_text()
        assert rc == 130, said[-3000:]
        assert "stopped by the user" in said and "failed" not in said.split("no longer hung", 1)[1], said[-3000:]
        assert json.loads((rd / "state.json").read_text())["status"] == "stopped"
        listed = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "runs", "--runs-dir", str(runs)], env=env,
                                capture_output=True, text=True, timeout=60)
        row = next(ln for ln in listed.stdout.splitlines() if rd.name in ln)
        assert "stopped" in row and "failed" not in row, listed.stdout
    finally:
        for pid in held:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if replay.poll() is None:
            os.killpg(replay.pid, signal.SIGTERM)
            replay.wait(60)
