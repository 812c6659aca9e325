"""`qwen-tui attach` trusts nothing it reads from a run directory: it signals only
processes that prove they are the run's job (pid > 1, the run's mark in their
environment, the start time recorded at launch), never a run that has ended, and a
corrupt run directory is a clear error. Run as a user runs it: the CLI in a
subprocess, against real processes."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwen_tui.nodes.jobs import JobRef, job_verdict
from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.plan.launch import LaunchPlan, NodeCommand
from qwen_tui.run.launcher import Launcher
from qwen_tui.run.rundir import RunDir
from support.paths import DEMO, ROOT


def _plan(run_id: str, run_dir: Path, argv=("sleep", "60")) -> LaunchPlan:
    nodes = [NodeCommand(rank=r, label="localhost", host="localhost", local=True, nproc=1, workdir=str(run_dir),
                         run_dir=str(run_dir), env={"HF_TOKEN": "hf_secret_value_123"}, argv=list(argv))
             for r in range(2)]
    return LaunchPlan(run_id=run_id, nnodes=2, world_size=2, master_addr="127.0.0.1", master_port=29999,
                      backend="gloo", effective_batch_size=2, batch_formula="1 x 1 x 2",
                      metrics_file=str(run_dir / "metrics.jsonl"), output_dir=str(run_dir / "out"), nodes=nodes)


def _run_dir(tmp_path: Path, name="crafted") -> RunDir:
    rd = RunDir.create(tmp_path / "runs", name)
    shutil.copy(DEMO, rd.path / "preset.yaml")
    rd.write_plan(_plan(name, rd.path))
    return rd


def _attach(rd: RunDir, *extra: str, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qwen_tui.cli", "attach", str(rd.path), *extra],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "250", "PYTHONPATH": str(ROOT)})


@pytest.fixture
def bystander():
    """An unrelated process group, as another user's job would be: `setsid sleep`."""
    p = subprocess.Popen(["sleep", "120"], start_new_session=True)  # = setsid sleep, pid known
    time.sleep(0.2)
    yield p
    p.kill()
    p.wait()


def _alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


def _start_of(pid: int) -> int:
    return LocalTransport().proc_start(pid)


@pytest.mark.parametrize("with_start", [False, True])
def test_attach_stop_refuses_an_unrelated_process_group_and_it_survives(tmp_path, bystander, with_start):
    rd = _run_dir(tmp_path)
    pid = bystander.pid
    rd.write_pids({0: pid, 1: pid}, starts={0: _start_of(pid), 1: _start_of(pid)} if with_start else None)
    rd.write_state(status="running")
    res = _attach(rd, "--stop")
    assert res.returncode == 1, res.stdout + res.stderr
    out = " ".join(res.stdout.split())
    assert f"node 0 (localhost): refusing to signal pid {pid}" in out, out
    assert "nothing was signalled" in out
    assert "Traceback" not in res.stdout + res.stderr
    time.sleep(0.3)
    assert _alive(bystander)
    assert json.loads((rd.path / "state.json").read_text())["status"] == "running"


@pytest.mark.parametrize("pid", [0, 1, -1])
def test_attach_refuses_pid_0_1_and_negative(tmp_path, pid):
    rd = _run_dir(tmp_path)
    rd.write_pids({0: pid, 1: pid}, starts={0: 1, 1: 1})
    rd.write_state(status="running")
    res = _attach(rd, "--stop")
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"refusing to signal pid {pid}" in " ".join(res.stdout.split())
    assert "Traceback" not in res.stdout + res.stderr


@pytest.mark.parametrize("status,stop,code", [("ok", True, 0), ("failed", False, 1), ("failed", True, 0)])
def test_a_finished_run_is_never_signalled(tmp_path, bystander, status, stop, code):
    rd = _run_dir(tmp_path)
    pid = bystander.pid
    rd.write_pids({0: pid, 1: pid}, starts={0: _start_of(pid), 1: _start_of(pid)})
    rd.write_state(status=status, message="recorded")
    for r in range(2):
        (rd.path / f"node-{r}.rc").write_text("0\n")
    before = (rd.path / "state.json").read_text()
    res = _attach(rd, *(["--stop"] if stop else []))
    assert res.returncode == code, res.stdout + res.stderr
    assert "already ended" in res.stdout
    time.sleep(0.3)
    assert _alive(bystander)
    assert (rd.path / "state.json").read_text() == before


def test_attach_stop_ends_the_runs_own_job_and_only_it(tmp_path, bystander):
    rd = _run_dir(tmp_path, "real")
    plan = rd.read_plan()
    la = Launcher(plan, {0: LocalTransport(), 1: LocalTransport()}, rd, stop_grace=3)
    la.start()
    try:
        jobs = rd.read_jobs(2)
        t = LocalTransport()
        for r, (pid, start) in jobs.items():
            assert start is not None
            assert job_verdict(t, JobRef(pid, start, plan.run_id))[0] == "ours"
            # the same pid with another start time, or another run's id, is not ours
            assert job_verdict(t, JobRef(pid, start + 1, "other-run"))[0] == "refused"
            # the job's secret is in its environment, not in any process's argv
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert b"hf_secret_value_123" not in cmdline
            log = rd.path / f"node-{r}.log"
            deadline = time.monotonic() + 30  # the job's shell creates its log as it starts (a race under load)
            while not log.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert log.stat().st_mode & 0o777 == 0o600
        res = _attach(rd, "--stop")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "stopped by the user" in res.stdout
        # the stop says where each node is while it runs, before the verdict
        before = res.stdout.split("stopped by the user", 1)[0]
        assert "stopping: node 0 (" in before and "stopping: node 1 (" in before, res.stdout
        for pid, start in jobs.values():
            assert job_verdict(t, JobRef(pid, start, plan.run_id))[0] == "gone"
        assert _alive(bystander)
        assert json.loads((rd.path / "state.json").read_text())["status"] == "stopped"
    finally:
        la.stop_all()


@pytest.mark.parametrize("name,content,expect", [
    ("plan.json", b"{not json", "plan.json: not valid JSON"),
    ("plan.json", b"\xff\xfe\x00", "plan.json: not UTF-8"),
    ("plan.json", b"{}", "plan.json: not a plan qwen-tui wrote"),
    ("plan.json", b"[1, 2]", "plan.json: not a plan qwen-tui wrote"),
    ("pids.json", b'"12345"', "pids.json: a JSON object rank -> number is needed"),
    ("pids.json", b"[1, 2]", "pids.json: a JSON object rank -> number is needed"),
    ("pids.json", b'{"7": 12345}', "rank '7': the plan has 2 node(s)"),
    ("pids.json", b'{"0": "12345"}', "the pid must be an integer"),
    ("state.json", b"[]", "state.json: a JSON object is needed"),
])
def test_a_corrupt_run_directory_is_a_clear_error(tmp_path, name, content, expect):
    rd = _run_dir(tmp_path)
    rd.write_pids({0: 2 ** 22 + 7, 1: 2 ** 22 + 7})
    rd.write_state(status="running")
    (rd.path / name).write_bytes(content)
    res = _attach(rd, "--stop")
    assert res.returncode == 2, res.stdout + res.stderr
    assert expect in " ".join(res.stdout.split()), res.stdout
    assert "Traceback" not in res.stdout + res.stderr
    assert (rd.path / name).read_bytes() == content


def test_run_directory_is_private(tmp_path):
    rd = _run_dir(tmp_path)
    rd.write_state(status="running")
    assert rd.path.stat().st_mode & 0o777 == 0o700
    for f in ("plan.json", "state.json"):
        assert (rd.path / f).stat().st_mode & 0o777 == 0o600
