"""Recovery on the same nodes: two local "nodes" with `training.restarts: 1`; node 1's training rank is
killed mid-run, replay relaunches both nodes from the last checkpoint with the batch unchanged, and an
`attach` started before the failure follows the run into its second attempt."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
MAX_STEPS, SAVE_STEPS = 40, 4


def preset_copy(tmp_path: Path, **training) -> Path:
    """The local demo preset with a free master port and these training values."""
    data = yaml.safe_load((ROOT / "presets" / "local-demo.yaml").read_text())
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    data["network"]["master_port"] = s.getsockname()[1]
    s.close()
    data["training"].update(training, output_dir=str(tmp_path / "out"))
    p = tmp_path / "demo.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _records(path: Path) -> list[dict]:
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
            ckpt = first_checkpoint(_records(rd / "metrics.jsonl"))
            if on_run_dir is not None:
                on_run_dir(rd)
        time.sleep(0.05)
    assert ckpt, log.read_text()[-3000:]
    return rd, ckpt


def _ranks_of_job(pgid: int) -> list[int]:
    """The worker processes of one node's job: they carry its job mark (they run in sessions of their own)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            environ = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        if f"QWEN_TUI_JOB_PGID={pgid}".encode() in environ and b"training.finetune" in cmd \
                and b"torch.distributed.run" not in cmd and not cmd.startswith(b"sh\0"):
            out.append(int(d))
    return out


def kill_ranks_holding_the_run(pids: dict, victim: str, holder: str = "0") -> list[int]:
    """SIGKILL node `victim`'s ranks while node `holder`'s are stopped (SIGSTOP), then let those go on: a tiny run
    steps every few tens of ms, and with the run held the kill lands where the caller saw it, not after the
    victim's ranks have already finished. Returns the killed pids."""
    held = _ranks_of_job(pids[holder])
    assert held, f"node {holder} has no rank to hold"
    try:
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        victims = _ranks_of_job(pids[victim])
        assert victims, f"node {victim} has no rank left to kill"
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
    finally:
        for pid in held:
            os.kill(pid, signal.SIGCONT)
    return victims


def test_a_killed_rank_is_relaunched_on_the_same_nodes_and_attach_follows(tmp_path):
    preset = preset_copy(tmp_path, max_steps=MAX_STEPS, save_steps=SAVE_STEPS, logging_steps=1,
                         per_device_train_batch_size=2, model_max_length=64, restarts=1)
    runs = tmp_path / "runs"
    cli = cli_in(tmp_path, runs)
    with open(tmp_path / "replay.log", "wb") as out:
        replay = cli("replay", str(preset), out=out)
    attach = None
    try:
        def attach_once(rd):
            nonlocal attach
            if attach is None:
                with open(tmp_path / "attach.log", "wb") as out:
                    attach = cli("attach", "last", out=out)

        rd, ckpt = wait_for_first_checkpoint(replay, runs, tmp_path / "replay.log", on_run_dir=attach_once)
        kill_ranks_holding_the_run(json.loads((rd / "pids.json").read_text()), "1")
        assert replay.wait(timeout=400) == 0, (tmp_path / "replay.log").read_text()[-4000:]
        assert attach.wait(timeout=120) == 0, (tmp_path / "attach.log").read_text()[-4000:]
        followed = (tmp_path / "attach.log").read_text()
        assert "attempt 2 started; following it" in followed and "training finished on every node" in followed

        state = json.loads((rd / "state.json").read_text())
        a1, a2 = state["attempts"]
        assert (state["status"], state["attempt"], a1["status"], a1["next"]) == ("ok", 2, "failed", "restart")
        assert a1["failed_rank"] == 1, a1  # the node whose rank was killed, whichever view saw it first
        assert a1["nodes"] == a2["nodes"] and a2["excluded"] == [] and a2["world_size"] == 2
        assert a1["batch"] == a2["batch"] == "2 per device x 1 accumulation x 1 GPUs per node x 2 nodes = 4"
        resumed = int(a2["resume_from"].rsplit("-", 1)[1])
        assert resumed >= ckpt
        # the second attempt's logs and exit codes apart from the first's
        assert (rd / "node-1.rc").read_text().strip() not in ("", "0")
        assert (rd / "attempt-2" / "node-1.rc").read_text().strip() == "0"
        assert (rd / "attempt-2" / "node-0.log").stat().st_size > 0
        # and its heartbeats where the monitor reads them (the hang watchdog of a relaunched attempt)
        node1 = json.loads((rd / "plan.json").read_text())["nodes"][1]
        beats = node1["argv"][node1["argv"].index("--heartbeat_dir") + 1]
        assert beats == str(rd / "attempt-2" / "heartbeat"), beats
        assert json.loads((rd / "attempt-2" / "heartbeat" / "rank-1.json").read_text())["step"] == MAX_STEPS
        recs = _records(rd / "metrics.jsonl")
        starts = [r for r in recs if r.get("event") == "start"]
        assert [s["start_step"] for s in starts] == [0, resumed] and starts[1]["gradient_accumulation_steps"] == 1
        after = [r["step"] for r in recs[recs.index(starts[1]):] if "loss" in r and "event" not in r]
        assert after == list(range(resumed + 1, MAX_STEPS + 1))
        assert [r for r in recs if r.get("event") == "end"][-1]["status"] == "ok"
    finally:
        for p in (replay, attach):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
                p.wait(timeout=60)
