"""attach over SSH on the namespace cluster: it signals only the run's own jobs, a
secret never shows in any process's argv on the nodes, and each node's log lands
under <workdir>/.qwen-tui/runs/<id>/ in a 0700 directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.files import save_preset
from qwen_tui.preset.schema import Preset
from qwen_tui.run.launcher import Launcher
from qwen_tui.run.rundir import RunDir
from support.cluster import REPO, preset_dict

SECRET = "hf_cluster_secret_9731"


def _preset(cluster, sshdir, tmp_path) -> Preset:
    d = preset_dict(cluster, sshdir, output_dir=str(tmp_path / "out"), max_steps=100000)
    d["network"]["env"] = {"OMP_NUM_THREADS": "1", "HF_TOKEN": SECRET}
    d["cluster"]["shared_storage"] = True
    return Preset.model_validate(d)


def _attach(rd: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qwen_tui.cli", "attach", str(rd), *extra], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "250", "PYTHONPATH": str(REPO)})


SLEEP = "3131"  # the bystander's sleep, told apart from the run's processes by its argument


class Bystander:
    """An unrelated process group on node 1: `setsid sleep`, started over SSH so it lives
    in the node's own pid namespace (each node has one); `pid` is its pid there."""

    def __init__(self, t):
        self.t = t
        r = t.run(["sh", "-c", f"setsid sleep {SLEEP} </dev/null >/dev/null 2>&1 & echo $!"], timeout=15)
        assert r.ok, r.stderr
        self.pid = int(r.stdout.split()[-1])
        time.sleep(0.3)
        self.start = t.proc_start(self.pid)

    def alive(self) -> bool:
        return self.t.run(["kill", "-0", str(self.pid)], timeout=15).ok

    def end(self) -> None:
        self.t.run(["kill", "-9", str(self.pid)], timeout=15)


def _jobs(cluster, i: int) -> list[int]:
    """The run's processes on node i (host pids), the bystander left out."""
    out = []
    for pid in cluster.job_pids(i):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() != f"sleep\0{SLEEP}\0".encode():
                out.append(pid)
        except FileNotFoundError:
            continue
    return out


@pytest.fixture
def bystander(cluster, sshdir, keyed, tmp_path):
    conns = connect_all(_preset(cluster, sshdir, tmp_path))
    assert conns.ok, conns.errors_text()
    b = Bystander(conns[1])
    yield b
    b.end()
    close_all(conns)


def test_attach_stop_on_a_crafted_run_dir_refuses_and_the_sleep_survives(cluster, sshdir, keyed, tmp_path, bystander):
    preset = _preset(cluster, sshdir, tmp_path)
    rd = RunDir.create(tmp_path / "runs", "crafted")
    save_preset(preset, rd.path / "preset.yaml", mode=0o600)
    rd.write_plan(make_plan(preset, run_id="crafted", local_run_dir=str(rd.path)))
    rd.write_pids({r: bystander.pid for r in range(3)}, starts={r: bystander.start for r in range(3)})
    rd.write_state(status="running")
    res = _attach(rd.path, "--stop")
    assert res.returncode == 1, res.stdout + res.stderr
    out = " ".join(res.stdout.split())
    assert f"refusing to signal pid {bystander.pid}" in out and "nothing was signalled" in out, out
    time.sleep(0.5)
    assert bystander.alive()
    for pid in (0, 1):
        rd.write_pids({r: pid for r in range(3)}, starts={r: 1 for r in range(3)})
        res = _attach(rd.path, "--stop")
        assert res.returncode == 1 and f"refusing to signal pid {pid}" in " ".join(res.stdout.split()), res.stdout


def test_a_real_run_hides_its_secret_logs_under_the_workdir_and_attach_stops_only_it(
        cluster, sshdir, keyed, tmp_path, bystander):
    preset = _preset(cluster, sshdir, tmp_path)
    conns = connect_all(preset)
    assert conns.ok, conns.errors_text()
    rd = RunDir.create(tmp_path / "runs", f"sec-{os.getpid()}")
    save_preset(preset, rd.path / "preset.yaml", mode=0o600)
    plan = make_plan(preset, run_id=rd.path.name, local_run_dir=str(rd.path))
    la = Launcher(plan, dict(conns), rd, stop_grace=5)
    node_runs = Path(REPO) / ".qwen-tui" / "runs" / plan.run_id
    try:
        la.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(_jobs(cluster, i) for i in range(3)):
            time.sleep(0.5)
        for i in range(3):
            for pid in _jobs(cluster, i):
                try:
                    assert SECRET.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
                except FileNotFoundError:
                    continue
        # every node's log and exit code live under its workdir (REPO), in a private directory
        assert (node_runs / "node-1.log").exists()
        assert node_runs.stat().st_mode & 0o777 == 0o700
        assert not list(node_runs.glob("*.env"))  # the environment file is gone once the job read it
        assert (rd.path / "preset.yaml").stat().st_mode & 0o777 == 0o600
        res = _attach(rd.path, "--stop")
        assert res.returncode == 0, res.stdout + res.stderr
        assert json.loads((rd.path / "state.json").read_text())["status"] == "stopped"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_jobs(cluster, i) for i in range(3)):
            time.sleep(0.3)
        assert not any(_jobs(cluster, i) for i in range(3))
        assert bystander.alive()
        # the run is over: a second stop signals nothing and changes nothing
        before = (rd.path / "state.json").read_text()
        res = _attach(rd.path, "--stop")
        assert res.returncode == 0 and "already ended" in res.stdout
        assert (rd.path / "state.json").read_text() == before
    finally:
        la.stop_all()
        close_all(conns)
        shutil.rmtree(node_runs, ignore_errors=True)
        shutil.rmtree(os.path.dirname(plan.metrics_file), ignore_errors=True)
