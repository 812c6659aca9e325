"""The driver role of a run (run/recovery/driver.py): a live driver is respected, a dead one (killed, a zombie not yet
reaped, or a reused pid) is taken over, and of several faces that claim at once exactly one wins.
Real processes and run directories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from qwen_tui.nodes.jobs import local_proc
from qwen_tui.run.recovery import driver
from qwen_tui.run.recovery.restarts import next_or_take_over
from qwen_tui.run.rundir import RunDir
from support.paths import ROOT


def _rundir(tmp_path: Path, **state) -> RunDir:
    rd = RunDir.create(tmp_path / "runs", "r1")
    rd.write_state(status="running", attempt=1, restarts=1,
                   attempts=[{"attempt": 1, "nodes": ["a", "b"]}], **state)
    return rd


def _record_of(p: subprocess.Popen) -> dict:
    return {"pid": p.pid, "start": local_proc(p.pid).start, "host": driver.me()["host"]}


def test_a_live_driver_is_respected_and_a_killed_one_taken_over(tmp_path):
    face = subprocess.Popen(["sleep", "60"])
    try:
        rd = _rundir(tmp_path, driver=_record_of(face))
        assert driver.alive(rd.read_state()["driver"])
        assert not driver.claim(rd)
        assert rd.read_state()["driver"]["pid"] == face.pid  # untouched
        assert next_or_take_over(rd, 1, bound=0.3, interval=0.1) == ("none", None)  # waited for it, in vain
        face.kill()
        deadline = time.monotonic() + 10
        while local_proc(face.pid).state != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)
        # killed and not reaped yet (what a SIGKILLed replay is until its parent waits): dead all the same
        assert not driver.alive(rd.read_state()["driver"])
        assert next_or_take_over(rd, 1, bound=5) == ("drive", None)
        assert driver.is_me(rd.read_state()["driver"])
        assert driver.claim(rd)  # claiming again is a no-op for the driver itself
    finally:
        face.kill()
        face.wait()


def test_a_reused_pid_or_a_malformed_record_is_no_driver(tmp_path):
    mine = driver.me()
    rd = _rundir(tmp_path, driver={**mine, "start": mine["start"] + 1})  # this pid, but started at another time
    assert not driver.alive(rd.read_state()["driver"]) and driver.claim(rd)
    for bad in (None, "x", {"pid": "12"}, {"pid": 0, "start": 1, "host": mine["host"]}):
        assert not driver.alive(bad)
    # a record made on another host is not judged from here: it is left alone
    assert driver.alive({"pid": 1, "start": 1, "host": mine["host"] + "-elsewhere"})


def test_release_ends_only_its_own_record(tmp_path):
    face = subprocess.Popen(["sleep", "60"])
    try:
        rd = _rundir(tmp_path, driver=_record_of(face))
        driver.release(rd)
        assert rd.read_state()["driver"]["pid"] == face.pid
        driver.record(rd)  # the launching face takes the role whatever was recorded
        assert driver.is_me(rd.read_state()["driver"])
        driver.release(rd)
        assert rd.read_state()["driver"] is None
    finally:
        face.kill()
        face.wait()


_CLAIMER = """
import sys, time, pathlib
from qwen_tui.run.recovery import driver
from qwen_tui.run.rundir import RunDir
go, done = pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
print("ready", flush=True)  # imported: from here a claim takes milliseconds
bound = time.monotonic() + 120
while not go.exists():
    if time.monotonic() > bound:
        sys.exit("no go within 120 s")
    time.sleep(0.001)
print(driver.claim(RunDir(pathlib.Path(sys.argv[1]))), flush=True)
end = time.monotonic() + 60
while not done.exists() and time.monotonic() < end:  # alive until every claim is made: a winner stays the driver
    time.sleep(0.01)
"""


def test_claims_that_race_have_one_winner(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = {"pid": dead.pid, "start": 1, "host": driver.me()["host"]}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for round_ in range(3):
        rd = RunDir(tmp_path / f"runs{round_}" / "r1")
        rd.path.mkdir(parents=True)
        rd.write_state(status="running", driver=stale)
        go, done = tmp_path / f"go{round_}", tmp_path / f"done{round_}"
        procs = [subprocess.Popen([sys.executable, "-c", _CLAIMER, str(rd.path), str(go), str(done)],
                                  stdout=subprocess.PIPE, text=True, env=env) for _ in range(4)]
        try:
            for p in procs:  # every claimer imported and waiting (a claimer exits within 120 s: readline ends)
                assert p.stdout.readline().strip() == "ready"
            go.touch()
            answers = []
            for p in procs:
                line = p.stdout.readline().strip()
                answers.append(line)
            assert sorted(answers) == ["False", "False", "False", "True"], answers
            winner = procs[answers.index("True")]
            assert json.loads((rd.path / "state.json").read_text())["driver"]["pid"] == winner.pid
        finally:
            done.touch()
            for p in procs:
                p.wait(timeout=60)
