"""Local launch end to end: two torchrun agents on this machine, a real rendezvous,
the tiny model trained for real; Ctrl-C, a failing node and a busy port."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from support.paths import DEMO
from support.ports import free_port
from support.procs import run_processes

pytestmark = pytest.mark.slow


def preset_copy(tmp_path, port, **training):
    data = yaml.safe_load(DEMO.read_text())
    data["network"]["master_port"] = port
    data["training"].update(training)
    data["training"]["output_dir"] = str(tmp_path / "out")
    p = tmp_path / "demo.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def qwen_tui(*args, cwd, timeout=600, **kw):
    return subprocess.run([sys.executable, "-m", "qwen_tui.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"}, **kw)


def only_run(runs: Path) -> Path:
    dirs = [d for d in runs.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_demo_preset_trains_and_loss_falls(demo_eval_run):
    """The README's demo preset replayed (on a free port, with eval data added: the run test_after_run.py follows;
    test_wheel.py runs it unchanged from the wheel): exits 0 and the loss falls."""
    rd = demo_eval_run
    stdout = (rd.parent.parent / "replay.out").read_text()
    recs = [json.loads(ln) for ln in (rd / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "event" not in r]
    assert recs[0]["event"] == "start" and recs[0]["world_size"] == 2
    assert recs[-1]["event"] == "end" and recs[-1]["status"] == "ok"
    losses = [r["loss"] for r in steps]
    assert len(losses) >= 5
    # falls by a margin, not by noise: the last logged loss well under the first
    assert losses[-1] < losses[0] * 0.8, losses
    state = json.loads((rd / "state.json").read_text())
    assert state["status"] == "ok"
    assert {n["rc"] for n in state["nodes"].values()} == {0}
    assert (rd / "node-0.log").exists() and (rd / "node-1.log").exists()
    assert "loss" in stdout and "training finished on every node" in stdout
    assert run_processes(rd.name) == []


def _wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@contextmanager
def training_replay(tmp_path, preset, runs):
    """`qwen-tui replay` in the background, yielded once its first step is logged:
    (process, run dir). If the test leaves it running, replay is asked to stop its nodes."""
    proc = subprocess.Popen([sys.executable, "-m", "qwen_tui.cli", "replay", str(preset), "--runs-dir", str(runs)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        rd = _wait_for(lambda: next(iter(runs.glob("*/metrics.jsonl")), None), 180, "training to start").parent
        _wait_for(lambda: '"step"' in (rd / "metrics.jsonl").read_text(), 120, "a first step")
        yield proc, rd
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # let replay stop the nodes it started
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_sigint_stops_every_process(tmp_path):
    runs = tmp_path / "runs"
    p = preset_copy(tmp_path, free_port(), max_steps=100000, logging_steps=1)
    with training_replay(tmp_path, p, runs) as (proc, rd):
        assert len(run_processes(rd.name)) >= 4  # 2 agents + 2 ranks at least
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-2000:]
    assert "stopped by the user" in out
    # the stop's progress, a line per node as its phase changes, and a quiet end in every node's log
    for r in (0, 1):
        assert f"stopping: node {r} (localhost) waiting for" in out, out[-3000:]
        assert f"stopping: node {r} (localhost) stopped" in out, out[-3000:]
    for r in (0, 1):
        log = (rd / f"node-{r}.log").read_text(errors="replace")
        assert "Traceback" not in log and "stopped by request at step" in log.splitlines()[-1], log[-2000:]
    assert json.loads((rd / "state.json").read_text())["status"] == "stopped"
    assert run_processes(rd.name) == []


def test_failing_node_is_named_and_nothing_is_left(tmp_path):
    runs = tmp_path / "runs"
    p = preset_copy(tmp_path, free_port(), max_steps=100000)
    with training_replay(tmp_path, p, runs) as (proc, rd):
        pids = json.loads((rd / "pids.json").read_text())
        # node 1 dies as a crashed machine would: every process of its job at once
        # (torchrun's ranks run in sessions of their own; the job's mark finds them)
        from qwen_tui.nodes.transport.local import _marked_pids
        victims = _marked_pids(pids["1"])
        assert len(victims) >= 2  # torchrun and its rank
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        os.killpg(pids["1"], signal.SIGKILL)  # the job's shell
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        secs = time.monotonic() - t0
    assert proc.returncode == 1, out[-2000:]
    assert "node 1 (localhost) failed" in out
    assert secs < 30
    state = json.loads((rd / "state.json").read_text())
    assert state["status"] == "failed" and state["failed_rank"] == 1
    assert run_processes(rd.name) == []


def test_busy_master_port_refuses_to_launch(tmp_path):
    runs = tmp_path / "runs"
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        res = qwen_tui("replay", str(preset_copy(tmp_path, port)), "--runs-dir", str(runs), cwd=tmp_path, timeout=60)
    finally:
        s.close()
    assert res.returncode == 1
    assert f"master port {port} is already in use" in res.stdout
    assert not runs.exists() or not any(runs.iterdir())


def test_bad_worker_python_fails_fast_naming_node(tmp_path):
    runs = tmp_path / "runs"
    data = yaml.safe_load(preset_copy(tmp_path, free_port()).read_text())
    data["cluster"]["nodes"][1]["python"] = "/nonexistent/python3"
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    res = qwen_tui("replay", str(p), "--runs-dir", str(runs), cwd=tmp_path, timeout=120)
    assert res.returncode == 1
    assert "node 1 (localhost) failed: exited with code 127" in res.stdout
    rd = only_run(runs)
    assert run_processes(rd.name) == []


def test_run_outlives_qwen_tui_and_attach_stops_it(tmp_path):
    runs = tmp_path / "runs"
    p = preset_copy(tmp_path, free_port(), max_steps=100000)
    with training_replay(tmp_path, p, runs) as (proc, rd):
        proc.kill()  # qwen-tui dies without a chance to clean up
        proc.wait(timeout=10)
    time.sleep(1)
    assert len(run_processes(rd.name)) >= 4, "the run must survive qwen-tui exiting"
    steps_before = (rd / "metrics.jsonl").read_text().count('"step"')
    res = qwen_tui("attach", str(rd), "--stop", cwd=tmp_path, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "stopped by the user; every node's processes were ended" in res.stdout
    assert run_processes(rd.name) == []
    assert json.loads((rd / "state.json").read_text())["status"] == "stopped"
    assert steps_before >= 1
