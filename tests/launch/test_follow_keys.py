"""Watching a run from the command line, in a real terminal (a pty), as a user does it: `replay`'s Ctrl-C stops
the run it launched and says so, `d` detaches from it (the run goes on), `attach`'s Ctrl-C detaches and says how
to stop; a Ctrl-C while the workers still start stops them at once, each node's log ending with its stop line."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from qwen_tui.run.rundir import RunDir
from support.paths import DEMO, ROOT
from support.ports import free_port
from support.procs import assert_quiet_stop_logs, importing_torch, run_processes

pytestmark = pytest.mark.slow


class Term:
    """qwen-tui on a pseudo-terminal: keys typed as a user types them (Ctrl-C is the terminal's SIGINT)."""

    def __init__(self, argv: list[str], cwd: Path):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: qwen-tui itself
            os.chdir(cwd)
            os.environ.update(COLUMNS="160", LINES="48", PYTHONPATH=str(ROOT))
            os.execv(sys.executable, [sys.executable, "-m", "qwen_tui", *argv])
        self.out = b""
        self.rc = None

    def read(self, seconds: float = 0.1) -> None:
        if select.select([self.fd], [], [], seconds)[0]:
            try:
                self.out += os.read(self.fd, 65536)
            except OSError:  # the child closed the terminal
                pass

    def text(self) -> str:
        return self.out.decode(errors="replace")

    def wait_for(self, pred, bound: float, what: str):
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            self.read()
            v = pred()
            if v:
                return v
        raise AssertionError(f"{what} within {bound:g} s; the screen ends:\n{self.text()[-3000:]}")

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def exit_code(self, bound: float) -> int:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            self.read()
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.read(0.2)
                self.rc = os.waitstatus_to_exitcode(status)
                return self.rc
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"qwen-tui did not exit within {bound:g} s:\n{self.text()[-3000:]}")


def demo_copy(tmp_path: Path) -> Path:
    data = yaml.safe_load(DEMO.read_text())
    data["network"]["master_port"] = free_port()
    data["name"] = f"keys-{uuid.uuid4().hex[:8]}"  # in the run id: run_processes finds this run's processes
    data["training"].update(max_steps=100000, logging_steps=1, save_strategy="no", output_dir=str(tmp_path / "out"))
    p = tmp_path / "demo.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def only_run(runs: Path) -> Path:
    (rd,) = [d for d in runs.iterdir() if d.is_dir()]
    return rd


def status(rd: Path) -> str:
    return json.loads((rd / "state.json").read_text())["status"]


def trained(rd: Path) -> bool:
    m = rd / "metrics.jsonl"
    return m.exists() and '"loss"' in m.read_text()


def test_replay_d_detaches_attach_ctrl_c_detaches_and_says_how_to_stop(tmp_path):
    preset, runs = demo_copy(tmp_path), tmp_path / "runs"
    replay = Term(["replay", str(preset), "--runs-dir", str(runs)], tmp_path)
    rd = None
    try:
        replay.wait_for(lambda: runs.is_dir() and any(runs.iterdir()), 120, "no run directory")
        rd = only_run(runs)
        replay.wait_for(lambda: trained(rd), 240, "no logged step")
        screen = replay.text()
        assert "Ctrl-C stops the run on every node" in screen and "d or Ctrl-\\ detaches" in screen, screen[-2000:]
        replay.type(b"d")
        assert replay.exit_code(30) == 0
        assert f"detached from run {rd.name}; it goes on" in replay.text()
        time.sleep(1.0)
        assert status(rd) == "running" and run_processes(rd.name), "detaching stopped the run"

        attach = Term(["attach", "last", "--runs-dir", str(runs)], tmp_path)
        attach.wait_for(lambda: "detaches (the run goes on)" in attach.text(), 60, "no detach hint in attach")
        assert "--stop stops it" in attach.text()
        attach.type(b"\x03")  # Ctrl-C, as the terminal sends it
        assert attach.exit_code(30) == 0
        assert "it goes on" in attach.text() and "--stop" in attach.text()
        time.sleep(1.0)
        assert status(rd) == "running" and run_processes(rd.name), "Ctrl-C in attach stopped the run"

        again = Term(["attach", "last", "--runs-dir", str(runs)], tmp_path)
        again.wait_for(lambda: "detaches" in again.text(), 60, "no live view on the second attach")
        os.kill(again.pid, signal.SIGQUIT)  # Ctrl-\, where no key can be read
        assert again.exit_code(30) == 0 and status(rd) == "running"
    finally:
        if rd is not None:
            from subprocess import run

            stop = run([sys.executable, "-m", "qwen_tui", "attach", str(rd), "--stop"], cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
            assert stop.returncode == 0, stop.stdout + stop.stderr
            assert run_processes(rd.name) == []
            assert status(rd) == "stopped"


def test_replay_ctrl_c_while_the_workers_start_stops_at_once_and_says_so(tmp_path):
    preset, runs = demo_copy(tmp_path), tmp_path / "runs"
    replay = Term(["replay", str(preset), "--runs-dir", str(runs)], tmp_path)
    replay.wait_for(lambda: runs.is_dir() and any(runs.iterdir())
                    and (only_run(runs) / "pids.json").exists(), 120, "no started run")
    rd = only_run(runs)
    pids = json.loads((rd / "pids.json").read_text())
    replay.wait_for(lambda: all(importing_torch(int(p)) for p in pids.values()), 120, "no rank importing torch")
    assert not trained(rd)
    t0 = time.monotonic()
    replay.type(b"\x03")
    assert replay.exit_code(60) == 130
    took = time.monotonic() - t0
    screen = replay.text()
    assert "stopping run" in screen and "on every node" in screen, screen[-2000:]  # said first
    # at once: no step is trained meanwhile, and the ranks end on their own as soon as their imports are done
    # (seconds; not killed after a grace, which cost the stop line); the bound is the stop's own for a starting run
    from qwen_tui.run.launcher import STARTING_EXTRA_S, STOP_GRACE_S

    assert took < STOP_GRACE_S + STARTING_EXTRA_S, f"the stop took {took:.1f} s"
    assert not trained(rd)
    assert_quiet_stop_logs(RunDir(rd).read_plan(), when="before training started")
    assert status(rd) == "stopped" and run_processes(rd.name) == []
