"""A stop over several nodes: a rank whose collective lost a peer that was stopped first waits a moment for
its own SIGTERM, so it ends as a stop (one line, no traceback) rather than as a failure."""

from __future__ import annotations

import os
import signal
import threading
import time

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
