"""A stop whose ranks end slowly but on their own (node 0's first worker becomes the stop's waiter, which imports
torch again: more than the grace on a loaded machine) is waited for, and nothing of the job is signalled a second
time; a rank that is still itself at the grace is not waited for. Real processes: a job (its shell, an "agent" in
its group, a "rank" in a session of its own, as torchrun's are) through both transports' node-side code."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from qwen_tui.nodes.jobs import ENDING_EXTRA_S, STOP_MARK, JobRef, job_verdict, stop_job
from qwen_tui.nodes.transport.local import LocalTransport
from support.shell_here import ShellHere

GRACE = 1.0
RANK_ENDS_AFTER = 3.0  # past the grace, well inside ENDING_EXTRA_S


def _text(path: str) -> str:
    """The file's text ("" before the detached job has made it)."""
    p = Path(path)
    return p.read_text() if p.is_file() else ""


def _job(t, tmp_path, marked: bool) -> tuple[JobRef, str, str]:
    """A job whose rank, asked to stop, becomes a process that ends RANK_ENDS_AFTER s later (carrying the waiter's
    mark where `marked`); the agent waits for it and then says so. (ref, log path, exit-code path)."""
    ending = f"exec env {STOP_MARK}=1 sleep {RANK_ENDS_AFTER}" if marked else f"exec sleep {RANK_ENDS_AFTER}"
    rank = f"trap '{ending}' TERM; echo rank-up; while :; do sleep 0.1; done"
    agent = 'setsid sh -c "$1" & wait $!; echo "agent ended on its own"'
    log, rc = str(tmp_path / "node-0.log"), str(tmp_path / "node-0.rc")
    pid = t.start_job(["sh", "-c", agent, "agent", rank], env={}, cwd=str(tmp_path), log=log, rcfile=rc,
                      run_id="r-stop")
    deadline = time.monotonic() + 20
    while "rank-up" not in _text(log) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "rank-up" in _text(log), _text(log)
    return JobRef(pid, t.proc_start(pid), "r-stop"), log, rc


@pytest.mark.parametrize("transport", ["local", "ssh scripts"])
def test_a_rank_in_the_stops_waiter_is_waited_for_and_its_agent_ends_on_its_own(tmp_path, transport):
    t = LocalTransport() if transport == "local" else ShellHere(tmp_path)
    ref, log, rc = _job(t, tmp_path, marked=True)
    phases: list[str] = []
    try:
        t0 = time.monotonic()
        assert stop_job(t, ref, grace=GRACE, on_phase=phases.append)
        took = time.monotonic() - t0
    finally:
        stop_job(LocalTransport(), ref, grace=0.1)
    assert job_verdict(t, ref)[0] == "gone"
    assert any(p.startswith("the workers have stopped; waiting up to") for p in phases), phases
    assert "SIGTERM to the rest of the job" not in phases and phases[-1] == "stopped", phases
    # the agent was never signalled: it saw its rank end and exited 0 itself
    assert "agent ended on its own" in open(log).read()
    assert open(rc).read() == "0\n"
    assert RANK_ENDS_AFTER - 0.5 < took < RANK_ENDS_AFTER + ENDING_EXTRA_S / 2, took


def test_a_rank_that_has_not_reached_the_waiter_at_the_grace_gets_the_usual_stop(tmp_path):
    t = LocalTransport()
    ref, log, rc = _job(t, tmp_path, marked=False)
    phases: list[str] = []
    try:
        t0 = time.monotonic()
        assert stop_job(t, ref, grace=GRACE, on_phase=phases.append)
        took = time.monotonic() - t0
    finally:
        stop_job(LocalTransport(), ref, grace=0.1)
    assert "SIGTERM to the rest of the job" in phases, phases
    assert not any(p.startswith("the workers have stopped") for p in phases), phases
    assert "agent ended on its own" not in open(log).read()
    assert took < RANK_ENDS_AFTER, took  # not waited for: signalled at the grace
