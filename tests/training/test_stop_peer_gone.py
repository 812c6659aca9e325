"""A stop over several nodes: a rank whose collective lost a peer that was stopped first waits a moment for
its own SIGTERM, so it ends as a stop (one line, no traceback) rather than as a failure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from support.paths import ROOT
from support.ports import free_port
from training.runtime.stop import StopSignal, peer_gone


def test_peer_gone_knows_gloo_and_nccl_words_only_in_a_run_of_several(monkeypatch):
    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [10.0.0.12]:4021: "
                        "Connection reset by peer")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert peer_gone(gloo)
    assert peer_gone(RuntimeError("NCCL communicator was aborted on rank 1"))
    assert not peer_gone(ValueError("data record 7: no assistant turn"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not peer_gone(gloo)


def test_await_stop_returns_when_the_signal_comes_and_gives_up_at_its_bound():
    stop = StopSignal()
    previous = stop.install()
    try:
        t0 = time.monotonic()
        assert stop.await_stop(0.3) is False and stop.signum is None
        assert 0.25 < time.monotonic() - t0 < 2.0
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        t0 = time.monotonic()
        assert stop.await_stop(10.0) is True  # the handler's StopRequested is the stop, not an error here
        assert time.monotonic() - t0 < 5.0 and stop.signum == signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_launchers_stop_grace_covers_the_workers_own_stop_waits():
    # qwen_tui does not import the worker (it runs on other nodes), so the bound is written twice: keep them one
    from qwen_tui.run.launcher import STOP_GRACE_S, WORKER_STOP_BOUND_S
    from training.runtime.stop import PEER_STOP_WAIT_S, PEERS_BOUND_S

    assert WORKER_STOP_BOUND_S >= PEERS_BOUND_S + PEER_STOP_WAIT_S
    assert STOP_GRACE_S > WORKER_STOP_BOUND_S


def _child_of(agent: subprocess.Popen, deadline: float) -> int:
    """The rank a torchrun agent started (its one child running the worker)."""
    while time.monotonic() < deadline:
        for d in os.listdir("/proc"):
            try:
                stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, ValueError):
                continue
            if d.isdigit() and int(stat[1]) == agent.pid and stat[0] != "Z":
                return int(d)
        time.sleep(0.1)
    raise AssertionError(f"agent {agent.pid} started no rank")


def _stop_line_at(log: Path) -> datetime:
    line = next((ln for ln in log.read_text(errors="replace").splitlines() if "stopped by request at step" in ln),
                None)
    assert line is not None, f"{log.name} has no stop line:\n{log.read_text(errors='replace')[-3000:]}"
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def test_a_stop_that_reaches_node_1_late_ends_quietly_on_both_nodes(tmp_path):
    """Two nodes (two torchrun agents); node 0's rank is stopped first and node 1's 1.5 s later, as a stop over SSH
    can land. Node 0's rank frees its connections when it stops, so node 1's rank, waiting in a collective with it,
    sees its peer gone at once and ends on its own signal; node 0's rank then waits (bounded) for node 1's agent
    and leaves last. Its connections once stayed open until it exited (the loop held the process group): node 1's
    rank stopped only after node 0's full 5 s wait, its agent came to the exit barrier after node 0's, and lost the
    store there with a traceback ("Error waiting on exit barrier")."""
    port = free_port()
    common = ["--model_name_or_path", "builtin:tiny", "--data_path", "builtin:demo-chat", "--use_cpu", "--use_lora",
              "--model_max_length", "64", "--per_device_train_batch_size", "2", "--max_steps", "100000",
              "--logging_steps", "1", "--save_strategy", "no", "--output_dir", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    logs = [tmp_path / f"node-{i}.log" for i in (0, 1)]
    agents = []
    try:
        for i in (0, 1):
            with open(logs[i], "w") as f:
                agents.append(subprocess.Popen(
                    [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(i),
                     "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                     "-m", "training.finetune", *common, "--metrics_file", str(tmp_path / f"metrics-{i}.jsonl")],
                    cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 240
        while "step 3/" not in logs[0].read_text(errors="replace"):
            assert time.monotonic() < deadline and agents[0].poll() is None, logs[0].read_text(errors="replace")
            time.sleep(0.2)
        ranks = [_child_of(a, deadline) for a in agents]
        os.kill(ranks[0], signal.SIGTERM)
        time.sleep(1.5)
        os.kill(ranks[1], signal.SIGTERM)
        for a in agents:
            assert a.wait(timeout=60) == 0, [lg.read_text(errors="replace")[-3000:] for lg in logs]
        for lg in logs:
            text = lg.read_text(errors="replace")
            assert "Traceback" not in text and "Error waiting on exit barrier" not in text, text[-3000:]
        # node 1 ended on its own signal, not when node 0's rank finally exited (node 0 waits up to 5 s)
        late = (_stop_line_at(logs[1]) - _stop_line_at(logs[0])).total_seconds()
        assert late < 4.0, f"node 1 stopped {late:.1f} s after node 0"
    finally:
        for a in agents:
            if a.poll() is None:  # a failed test leaves no rank behind: the agent's whole session goes
                os.killpg(a.pid, signal.SIGKILL)
                a.wait(timeout=30)
