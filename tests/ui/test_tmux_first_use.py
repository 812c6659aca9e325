"""A first use in a real 80x24 terminal, keyboard only: the installed `qwen-tui` on (a copy of) the demo
goes through every step, launches, watches the run, detaches (ctrl+q leaves it running), re-attaches by
opening the app again, stops it, relaunches a short run to its end, chats with the trained model and
quits. What the screen shows is asserted at each step; a resize round trip leaves no stray characters.
Every wait is for text on the screen, with a bound."""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from support.paths import DEMO, ROOT
from support.ports import free_port
from support.tmux import end_session, keys, screen, stop_leftovers, tmux, type_into, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

RUN_WAIT_S = 150.0  # a 6-step tiny CPU run: about 35 s on an idle 2-core machine, much more under load


def wait_re(session: str, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    s = ""
    while time.monotonic() < deadline:
        s = screen(session)
        if re.search(pattern, s):
            return s
        time.sleep(0.3)
    raise AssertionError(f"{pattern!r} not on screen after {timeout:g}s:\n{s}")


def state_of(runs: Path) -> dict[str, str]:
    return {p.parent.name: json.loads(p.read_text())["status"] for p in runs.glob("*/state.json")}


def settled(session: str, *texts: str, timeout: float = 30.0) -> str:
    """The screen once `texts` are on it and it has stopped changing (a step is drawn in parts)."""
    deadline = time.monotonic() + timeout
    last = wait_for(session, *texts, timeout=timeout)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = screen(session)
        if now == last and all(t in now for t in texts):
            return now
        last = now
    raise AssertionError(f"the screen did not settle with {texts!r} after {timeout:g}s:\n{last}")


def assert_fits(s: str) -> None:
    lines = s.splitlines()
    assert len(lines) <= 24 and all(len(ln) <= 80 for ln in lines), s
    assert "F10 Help" in lines[-1], f"the footer lost Help:\n{s}"


def test_first_use_at_80x24(tmp_path):
    session = f"qt-{uuid.uuid4().hex[:8]}"
    exe = Path(sys.executable).with_name("qwen-tui")
    runs, out, preset = tmp_path / "runs", tmp_path / "out", tmp_path / "demo.yaml"
    data = yaml.safe_load(DEMO.read_text())
    data["network"]["master_port"] = free_port()
    data["training"].update(output_dir=str(out), max_steps=5000)  # long enough to detach, re-attach and stop
    preset.write_text(yaml.safe_dump(data, sort_keys=False))
    env = f"PYTHONPATH={shlex.quote(str(ROOT))} QWEN_TUI_RUNS={shlex.quote(str(runs))}"
    app = f"{env} {shlex.quote(str(exe))} {shlex.quote(str(preset))}"
    # the app twice: the second start is the re-attach after the first one detached
    # COLUMNS/LINES (pytest exports them) would pin the size the app reads on a resize (shutil's rule)
    cmd = (f"unset COLUMNS LINES; stty cols 80 rows 24; cd {shlex.quote(str(ROOT))} && "
           f"{app}; echo EXITED=$?; {app}; echo AGAIN=$?; "
           "sleep 60")
    tmux("new-session", "-d", "-s", session, "-x", "80", "-y", "24", cmd)
    try:
        # 1 Nodes
        s = settled(session, "Nodes: the machines of this run", "F10 Help", timeout=40)
        assert_fits(s)
        assert re.search(r"F1 Nodes.*F6 Run", s.splitlines()[0]), s
        keys(session, "p")
        s = wait_re(session, r"(?s)✔ probed.*✔ probed", timeout=60)
        assert_fits(s)

        # 2 SSH, 3 Network
        keys(session, "F2")
        assert_fits(settled(session, "Every node is this machine"))
        keys(session, "F3")
        s = settled(session, "Network: workers reach the master", "master port")
        assert_fits(s)

        # 4 Training: the live panel wraps (no word cut at the edge); `?` opens help without typing
        keys(session, "F4")
        s = settled(session, "model (hub id or path)", "Live estimate", "effective")
        assert_fits(s)
        keys(session, "?")
        s = settled(session, "Help: Training", "Close (esc)")
        assert_fits(s)
        keys(session, "Escape")
        s = settled(session, "builtin:tiny", "Live estimate")
        assert "builtin:tiny?" not in s and "│ ?" not in s
        # a resize round trip: the same screen, nothing left of the wider layout
        before = s
        tmux("resize-window", "-t", session, "-x", "150", "-y", "45")
        wait_for(session, "F4 Training", "^s Save")
        tmux("resize-window", "-t", session, "-x", "70", "-y", "20")
        wait_for(session, "Terminal too small: 70x20", "at least 80 columns and 24 rows")
        tmux("resize-window", "-t", session, "-x", "80", "-y", "24")
        deadline = time.monotonic() + 20
        while screen(session) != before and time.monotonic() < deadline:
            time.sleep(0.3)
        assert screen(session) == before, f"after the resizes:\n{screen(session)}\nbefore:\n{before}"

        # 5 Review, then launch
        keys(session, "F5")
        s = settled(session, "Commands per node", "2 nodes, world size 2, backend gloo")
        assert_fits(s)
        keys(session, "l")
        wait_re(session, r"step \d+/5000", timeout=RUN_WAIT_S)
        s = wait_for(session, "running ·", "F6 Run▶", "F10 Help", timeout=20)
        assert "Run!" not in s
        assert_fits(s)
        first = next(iter(state_of(runs)))

        # detach: ctrl+q leaves the run going
        keys(session, "C-q")
        s = wait_for(session, "EXITED=0", timeout=30)
        assert state_of(runs) == {first: "running"}
        assert "goes on without the wizard" in s and f"qwen-tui attach {first} --stop" in s, s  # said on quitting

        # re-attach: the app opened again finds the run and follows it
        wait_re(session, r"step \d+/5000", timeout=60)
        s = wait_for(session, "running ·", "F6 Run▶", timeout=20)
        assert_fits(s)

        # stop: asks, then every node says stopped, no sample and no ETA are left
        keys(session, "s")
        wait_for(session, "Stop the run on every node?")
        keys(session, "y")
        wait_for(session, "stopped:", "not watched: the run has ended", "F6 Run!", timeout=90)
        s = settled(session, "stopped:")
        assert "ETA" not in s and "│ stopped" in s and "│ ok" not in s
        assert state_of(runs)[first] == "stopped"

        # relaunch a short run: 6 steps (the max steps field, so many fields after the model)
        keys(session, "F4")
        wait_for(session, "model (hub id or path)")
        keys(session, *["Tab"] * _tabs("training.model", "training.max_steps"), pause=0.15)
        # cleared and typed in one write, as a loaded machine delivers it: the app keeps the keys' order
        type_into(session, "6")
        wait_re(session, r"max steps \(-1: epochs\)\s+6\s", timeout=20)
        keys(session, "F6")
        wait_for(session, "stopped:")
        keys(session, "l")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the last run left files in the output dir: it may ask first
            s = screen(session)
            if "already holds a run" in s:
                keys(session, "y")
            if len(state_of(runs)) == 2:
                break
            time.sleep(0.3)
        assert len(state_of(runs)) == 2, screen(session)
        wait_for(session, "ok: training finished on every node", "step 6/6", timeout=RUN_WAIT_S)
        s = settled(session, "ok: training finished on every node")
        assert "/5000" not in s  # the stopped run's log and curve are gone
        assert_fits(s)
        second = next(r for r in state_of(runs) if r != first)
        assert state_of(runs) == {first: "stopped", second: "ok"}

        # chat with the trained model
        keys(session, "c")
        wait_for(session, "Chat with", "your message", timeout=30)
        tmux("send-keys", "-t", session, "-l", "hello")
        keys(session, "Enter")
        s = wait_re(session, r"model  \S|✘", timeout=120)
        assert "model  " in s, s
        keys(session, "Escape")
        wait_for(session, "ok: training finished on every node")

        # quit: the preset was edited (max steps), so it asks
        keys(session, "C-q")
        wait_for(session, "Quit without saving?")
        keys(session, "y")
        wait_for(session, "AGAIN=0", timeout=30)
    finally:
        end_session(session)
        stop_leftovers(runs)


def _tabs(start: str, to: str) -> int:
    """Tab presses from one field of the Training step to another, in the form's own order (the GPU type select
    follows the device's)."""
    from qwen_tui.ui.screens.training import FIELDS

    paths = [p for p, _, _ in FIELDS]
    a, b = paths.index(start), paths.index(to)
    return b - a + (a <= paths.index("training.device") < b)
