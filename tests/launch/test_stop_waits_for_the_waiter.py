"""A stop whose ranks end slowly but on their own (node 0's first worker becomes the stop's waiter, which imports
torch again: more than the grace on a loaded machine) is waited for, and nothing of the job is signalled a second
time; a rank that is still itself at the grace is not waited for. Real processes: a job (its shell, an "agent" in
its group, a "rank" in a session of its own, as torchrun's are) through both transports' node-side code."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from qwen_tui.nodes.jobs import ENDING_EXTRA_S, STOP_MARK, JobRef, Waiters, job_verdict, stop_job
from qwen_tui.nodes.transport.local import LocalTransport
from support.shell_here import ShellHere

GRACE = 1.0
RANK_ENDS_AFTER = 3.0  # past the grace, well inside ENDING_EXTRA_S


def _text(path: str) -> str:
    """The file's text ("" before the detached job has made it)."""
    p = Path(path)
    return p.read_text() if p.is_file() else ""


def _start(t, tmp_path: Path, name: str, agent: str, rank: str) -> tuple[JobRef, str, str]:
    """Starts a job whose "agent" (`sh -c AGENT agent RANK`) runs `rank` in a session of its own; returns once the
    rank has said "rank-up". (ref, log path, exit-code path)"""
    log, rc = str(tmp_path / f"{name}.log"), str(tmp_path / f"{name}.rc")
    pid = t.start_job(["sh", "-c", agent, "agent", rank], env={}, cwd=str(tmp_path), log=log, rcfile=rc,
                      run_id="r-stop")
    deadline = time.monotonic() + 20
    while "rank-up" not in _text(log) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "rank-up" in _text(log), _text(log)
    return JobRef(pid, t.proc_start(pid), "r-stop"), log, rc


def _job(t, tmp_path, marked: bool) -> tuple[JobRef, str, str]:
    """A job whose rank, asked to stop, becomes a process that ends RANK_ENDS_AFTER s later (carrying the waiter's
    mark where `marked`); the agent waits for it and then says so."""
    ending = f"exec env {STOP_MARK}=1 sleep {RANK_ENDS_AFTER}" if marked else f"exec sleep {RANK_ENDS_AFTER}"
    rank = f"trap '{ending}' TERM; echo rank-up; while :; do sleep 0.1; done"
    return _start(t, tmp_path, "node-0", 'setsid sh -c "$1" & wait $!; echo "agent ended on its own"', rank)


def _stopped(t, ref: JobRef) -> tuple[list[str], float]:
    """Stops the job with the GRACE; the phases it went through and how long it took (whatever is left after a
    failed assertion is killed)."""
    phases: list[str] = []
    try:
        t0 = time.monotonic()
        assert stop_job(t, ref, grace=GRACE, on_phase=phases.append)
        return phases, time.monotonic() - t0
    finally:
        stop_job(LocalTransport(), ref, grace=0.1)


@pytest.mark.parametrize("transport", ["local", "ssh scripts"])
def test_a_rank_in_the_stops_waiter_is_waited_for_and_its_agent_ends_on_its_own(tmp_path, transport):
    t = LocalTransport() if transport == "local" else ShellHere(tmp_path)
    ref, log, rc = _job(t, tmp_path, marked=True)
    phases, took = _stopped(t, ref)
    assert job_verdict(t, ref)[0] == "gone"
    assert any(p.startswith("the workers have stopped; waiting up to") for p in phases), phases
    assert "SIGTERM to the rest of the job" not in phases and phases[-1] == "stopped", phases
    # the agent was never signalled: it saw its rank end and exited 0 itself
    assert "agent ended on its own" in _text(log)
    assert _text(rc) == "0\n"
    assert RANK_ENDS_AFTER - 0.5 < took < RANK_ENDS_AFTER + ENDING_EXTRA_S / 2, took


def test_a_rank_that_has_not_reached_the_waiter_at_the_grace_gets_the_usual_stop(tmp_path):
    t = LocalTransport()
    ref, log, rc = _job(t, tmp_path, marked=False)
    phases, took = _stopped(t, ref)
    assert "SIGTERM to the rest of the job" in phases, phases
    assert not any(p.startswith("the workers have stopped") for p in phases), phases
    assert "agent ended on its own" not in _text(log)
    assert took < RANK_ENDS_AFTER, took  # not waited for: signalled at the grace


def _lone_agent(t, tmp_path, name: str, until: Path) -> tuple[JobRef, str, str]:
    """A job whose rank ends at once when asked to stop, and whose agent then waits (as at torchrun's exit barrier)
    until `until` exists, then says so."""
    agent = f'setsid sh -c "$1" & wait $!; while [ ! -e {until} ]; do sleep 0.1; done; echo "agent ended on its own"'
    return _start(t, tmp_path, name, agent, "trap 'exit 0' TERM; echo rank-up; while :; do sleep 0.1; done")


@pytest.mark.parametrize("node0_has_a_waiter", [True, False])
def test_an_agent_left_alone_is_waited_for_only_while_another_nodes_waiter_runs(tmp_path, node0_has_a_waiter):
    """Node 1's agent waits at the exit barrier for node 0's, which waits for node 0's waiter: the stops of both
    nodes (in parallel, as the launcher's) share what they saw. Without a waiter anywhere (a node died and its agent
    never checks in) the lone agent gets the usual stop at the grace."""
    t = LocalTransport()
    barrier = tmp_path / "node-0-agent-checked-in"
    (tmp_path / "n0").mkdir()
    ref0, log0, rc0 = _job(t, tmp_path / "n0", marked=node0_has_a_waiter)
    ref1, log1, rc1 = _lone_agent(t, tmp_path, "node-1", until=barrier)
    waiters = Waiters()
    phases: dict[int, list[str]] = {0: [], 1: []}
    gone: dict[int, bool] = {}

    def stop(rank: int, ref: JobRef) -> None:
        gone[rank] = stop_job(t, ref, grace=GRACE, on_phase=phases[rank].append, waiters=waiters)
        if rank == 0 and node0_has_a_waiter:
            barrier.touch()  # node 0's agent has checked in: the barrier lets node 1's go (else it never comes)

    threads = [threading.Thread(target=stop, args=(r, ref)) for r, ref in ((0, ref0), (1, ref1))]
    try:
        t0 = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        took = time.monotonic() - t0
    finally:
        for ref in (ref0, ref1):
            stop_job(LocalTransport(), ref, grace=0.1)
    assert gone == {0: True, 1: True}
    if node0_has_a_waiter:
        for rank in (0, 1):
            assert "SIGTERM to the rest of the job" not in phases[rank], (rank, phases)
        assert "agent ended on its own" in _text(log1) and _text(rc1) == "0\n", phases
    else:
        assert "SIGTERM to the rest of the job" in phases[1], phases
        assert "agent ended on its own" not in _text(log1)
        assert took < RANK_ENDS_AFTER + 2 * GRACE + 5, took
