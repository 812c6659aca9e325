"""Runs are found from any directory: the default runs root is $XDG_STATE_HOME/qwen-tui/runs, `qwen-tui runs`
lists them, and `attach` takes a run id or `last`."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from support.paths import DEMO, ROOT
from support.procs import run_processes
from support.runs import fake_run


def env_with_state(state: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "QWEN_TUI_RUNS"}
    return {**env, "XDG_STATE_HOME": str(state), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def qwen_tui(*args, cwd, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "qwen_tui", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_runs_root_follows_qwen_tui_runs_then_xdg(tmp_path, monkeypatch):
    from qwen_tui.run.rundir import default_runs_root

    monkeypatch.delenv("QWEN_TUI_RUNS", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_runs_root() == tmp_path / "state" / "qwen-tui" / "runs"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_runs_root() == tmp_path / "home" / ".local" / "state" / "qwen-tui" / "runs"
    monkeypatch.setenv("QWEN_TUI_RUNS", str(tmp_path / "mine"))
    assert default_runs_root() == tmp_path / "mine"


def test_runs_lists_and_attach_resolves_ids(tmp_path):
    from qwen_tui.run.runs import RunNotFound, list_runs, resolve_run

    root = tmp_path / "runs"
    old = fake_run(root, "alpha-20261130-1", 1000.0, losses=[2.5, 2.0])
    new = fake_run(root, "beta-20261201-1", 2000.0, status="running", losses=[3.0, 2.75, 2.5])
    fake_run(root, "beta-20261201-2", 1500.0)
    (root / "not-a-run").mkdir()
    runs = list_runs(root)
    assert [r.run_id for r in runs] == ["alpha-20261130-1", "beta-20261201-2", "beta-20261201-1"]  # by start
    last = runs[-1]
    assert (last.preset, last.state, last.nodes, last.step, last.last_loss) == ("beta", "running", ["gpu-1", "gpu-2"],
                                                                                3, 2.5)
    assert runs[1].last_loss is None
    assert resolve_run("last", root) == new
    assert resolve_run("alpha-20261130-1", root) == old
    assert resolve_run("alpha", root) == old  # a unique prefix
    assert resolve_run(str(old), root) == old
    # `runs/<id>` as the runs are shown, typed where no runs/ is: the run of that id (or prefix) in the root
    assert resolve_run("runs/alpha-20261130-1", root) == old and resolve_run("runs/alpha/", root) == old
    with pytest.raises(RunNotFound, match="matches 2 runs"):
        resolve_run("beta", root)
    with pytest.raises(RunNotFound, match="no run 'gamma'"):
        resolve_run("gamma", root)
    with pytest.raises(RunNotFound, match="no runs in"):
        resolve_run("last", tmp_path / "empty")
    res = qwen_tui("attach", "gamma", "--runs-dir", str(root), cwd=tmp_path, env=env_with_state(tmp_path))
    assert res.returncode == 2 and "no run 'gamma'" in res.stderr


@pytest.mark.slow
def test_runs_and_attach_last_from_another_directory(tmp_path):
    """Started in one directory, listed and stopped from another, with nothing but the default runs root."""
    state, here, there = tmp_path / "state", tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    data = yaml.safe_load(DEMO.read_text())
    data["training"].update(max_steps=100000, logging_steps=1, output_dir=str(tmp_path / "out"))
    s = __import__("socket").socket()
    s.bind(("127.0.0.1", 0))
    data["network"]["master_port"] = s.getsockname()[1]
    s.close()
    preset = here / "demo.yaml"
    preset.write_text(yaml.safe_dump(data))
    env = env_with_state(state)
    runs = state / "qwen-tui" / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "qwen_tui", "replay", str(preset)], cwd=here, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            m = next(iter(runs.glob("*/metrics.jsonl")), None)
            if m is not None and '"loss"' in m.read_text():
                break
            time.sleep(0.5)
        else:
            raise AssertionError("no logged step within 240 s")
        proc.kill()  # qwen-tui goes; the run stays
        proc.wait(timeout=10)
        (rd,) = runs.iterdir()
        listing = qwen_tui("runs", cwd=there, env=env)
        assert listing.returncode == 0, listing.stderr
        row = next(line for line in listing.stdout.splitlines() if rd.name in line)
        assert "local-demo" in row and "running" in row and "2: localhost, localhost" in row
        rows = json.loads(qwen_tui("runs", "--json", cwd=there, env=env).stdout)
        assert len(rows) == 1 and rows[0]["last_loss"] > 0 and rows[0]["step"] >= 1
        stop = qwen_tui("attach", "last", "--stop", cwd=there, env=env, timeout=90)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert run_processes(rd.name) == []
        after = json.loads(qwen_tui("runs", "--json", cwd=there, env=env).stdout)
        assert after[0]["state"] == "stopped"
        assert not (here / "runs").exists() and not (there / "runs").exists()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
        for d in runs.glob("*") if runs.is_dir() else []:
            if run_processes(d.name):  # a failed assertion above must not leave the nodes training
                qwen_tui("attach", str(d), "--stop", cwd=there, env=env, timeout=90)
