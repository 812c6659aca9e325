"""Multi-node launch over SSH through the lead's Launcher and the SSHTransport."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest

from qwen_tui.nodes.checks.runner import run_checks
from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.schema import Preset
from qwen_tui.run.launcher import STOP_GRACE_S, Launcher
from qwen_tui.run.rundir import RunDir
from support.cluster import preset_dict
from support.launcher_wait import wait_steps


def _preset(cluster, sshdir, tmp_path, **training) -> Preset:
    d = preset_dict(cluster, sshdir, output_dir=str(tmp_path / "out"), **training)
    d["network"]["env"] = {"OMP_NUM_THREADS": "1"}  # three CPU "nodes" share two cores
    d["cluster"]["shared_storage"] = True  # the namespaces share this machine's disk
    return Preset.model_validate(d)


@pytest.fixture(scope="module")
def facts(cluster, sshdir, keyed, tmp_path_factory):
    p = _preset(cluster, sshdir, tmp_path_factory.mktemp("facts"))
    conns = connect_all(p)
    assert conns.ok, conns.errors_text()
    try:
        yield run_checks(p, dict(conns), network=False).facts
    finally:
        close_all(conns)


@pytest.fixture
def launched(cluster, facts, tmp_path):
    """Start a run; afterwards remove what it left in the shared workdir (the master's metrics)."""
    made = []

    def launch(preset, name):
        name = f"{name}-{os.getpid()}"
        conns = connect_all(preset)
        assert conns.ok, conns.errors_text()
        rd = RunDir.create(tmp_path / "runs", name)
        plan = make_plan(preset, run_id=name, local_run_dir=str(rd.path), facts=facts)
        la = Launcher(plan, dict(conns), rd, stop_grace=5)
        made.append((la, conns))
        la.start()
        return la, conns

    yield launch
    for la, conns in made:
        la.stop_all()
        close_all(conns)
        shutil.rmtree(os.path.dirname(la.plan.metrics_file), ignore_errors=True)


def _no_job_left(cluster, bound=10.0):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        left = {i: cluster.job_pids(i) for i in range(len(cluster.nodes))}
        if not any(left.values()):
            return {}
        time.sleep(0.3)
    return left


def test_three_node_lora_run_over_ssh_loss_falls_rank0_writes_metrics(cluster, sshdir, launched, tmp_path):
    preset = _preset(cluster, sshdir, tmp_path, max_steps=12, learning_rate=5e-3)
    la, conns = launched(preset, "lora3")
    try:
        out = la.wait(interval=0.5, max_seconds=300)
        assert out.status == "ok", (out.message, [la.log_tail(r) for r in range(3)])
        prog = la.metrics.progress
        losses = prog.losses
        assert len(losses) >= 10 and prog.start and prog.end
        assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.01, losses
        # one writer: a single start/end and every step once
        lines = [json.loads(x) for x in open(la.plan.metrics_file).read().splitlines() if x.strip()]
        steps = [r["step"] for r in lines if "step" in r and r.get("event") not in ("start", "end")]
        assert len(steps) == len(set(steps))
        assert sum(r.get("event") == "start" for r in lines) == 1
        # the master is reached over SSH: the run directory keeps what was read from it, byte for byte
        kept = la.run_dir.path / "metrics.jsonl"
        assert kept.is_file(), sorted(os.listdir(la.run_dir.path))
        assert kept.read_bytes() == open(la.plan.metrics_file, "rb").read()
        assert prog.start.get("world_size", 3) == 3
        # the logs live in the run directory on each node
        for c in la.plan.nodes:
            assert b"" != conns[c.rank].read_file(c.log_path)
        assert _no_job_left(cluster) == {}
    finally:
        la.stop_all()


def test_killing_a_worker_mid_run_names_the_node_and_leaves_nothing(cluster, sshdir, launched, tmp_path):
    preset = _preset(cluster, sshdir, tmp_path, max_steps=100000)
    la, conns = launched(preset, "kill")
    try:
        wait_steps(la, 2, 150)
        victims = cluster.job_pids(2)
        assert victims
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        out = la.wait(interval=0.5, max_seconds=60)
        assert time.monotonic() - t0 < 20
        assert out.status == "failed" and out.exit_code != 0
        assert out.failed_rank == 2 and "node2" in out.message, out.message
        assert _no_job_left(cluster) == {}
    finally:
        la.stop_all()


def test_stop_all_during_a_run_leaves_no_process_on_any_node(cluster, sshdir, launched, tmp_path):
    preset = _preset(cluster, sshdir, tmp_path, max_steps=100000)
    la, conns = launched(preset, "stop")
    # The default grace, not the fixture's 5 s: a stopped worker itself may take up to WORKER_STOP_BOUND_S
    # (training/runtime/stop.py), and an agent still on its way out after the grace is signalled into a traceback.
    la.stop_grace = STOP_GRACE_S
    try:
        wait_steps(la, 1, 150)
        assert all(cluster.job_pids(i) for i in range(3))
        la.request_stop()
        out = la.wait(interval=0.5, max_seconds=60)
        assert out.status == "stopped"
        assert _no_job_left(cluster, bound=3) == {}
        # a clean stop over SSH too: each node's log ends with the worker's stop line, no traceback
        for r in range(3):
            tail = la.log_tail(r, lines=200)
            assert not any("Traceback" in ln for ln in tail), "\n".join(tail[-20:])
            assert "stopped by request at step" in tail[-1], "\n".join(tail[-20:])
            assert la.stop_progress()[r] == "stopped", la.stop_progress()
    finally:
        la.stop_all()


def test_a_missing_module_on_one_node_is_named_with_cause_and_fix(cluster, sshdir, launched, tmp_path):
    # node1's workdir holds a copy of the worker whose dependency is not installed there
    pkg = tmp_path / "node1-workdir" / "training"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import qt_dependency_missing_on_this_node\n")
    preset = _preset(cluster, sshdir, tmp_path, max_steps=100000)
    preset.cluster.nodes[1].workdir = str(pkg.parent)
    la, conns = launched(preset, "nomod")
    out = la.wait(interval=0.5, max_seconds=120)
    assert out.status == "failed" and out.failed_rank == 1, out.message
    assert "module 'qt_dependency_missing_on_this_node' is missing" in out.message, out.message
    assert "fix:" in out.message and "last log lines" in out.message
    assert _no_job_left(cluster) == {}


def _cmdline(pid: int) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""


def test_job_shell_and_agent_killed_together_name_the_node_within_15s(cluster, sshdir, launched, tmp_path):
    # The ranks run in sessions of their own: they outlive their agent, and the job shell
    # that writes the exit code is gone too. The node must not look alive on their account.
    preset = _preset(cluster, sshdir, tmp_path, max_steps=100000)
    la, conns = launched(preset, "agent")
    try:
        wait_steps(la, 2, 150)
        procs = {pid: _cmdline(pid) for pid in cluster.job_pids(1)}
        shell = [p for p, c in procs.items() if c.startswith(b"sh\0-c\0export QWEN_TUI_JOB_PGID")]
        agent = [p for p, c in procs.items() if p not in shell and b"torch.distributed.run" in c]
        ranks = [p for p, c in procs.items() if p not in shell + agent and b"training" in c]
        assert len(shell) == 1 and len(agent) == 1 and ranks, procs
        for pid in shell + agent:
            os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        out = la.wait(interval=0.5, max_seconds=60)
        took = time.monotonic() - t0
        assert out.status == "failed" and out.failed_rank == 1 and "node1" in out.message, out.message
        assert took < 15, (took, out.message)
        assert _no_job_left(cluster) == {}  # the orphaned rank was stopped with the rest
    finally:
        la.stop_all()
