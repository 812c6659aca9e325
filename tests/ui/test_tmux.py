"""The real terminal program in tmux: `qwen-tui presets/local-demo.yaml` starts,
F1/F2 move between the first two steps, a node can be added from the keyboard,
ctrl+q quits cleanly."""

from __future__ import annotations

import shlex
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest

from support.paths import ROOT
from support.tmux import end_session, tmux, wait_for

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")


def test_first_two_steps_in_a_real_terminal(tmp_path):
    session = f"qt-{uuid.uuid4().hex[:8]}"
    exe = Path(sys.executable).with_name("qwen-tui")
    # COLUMNS/LINES (pytest exports them) would pin the size the app reads instead of the pane's (shutil's rule)
    cmd = (f"unset COLUMNS LINES; cd {shlex.quote(str(ROOT))} && QWEN_TUI_RUNS={shlex.quote(str(tmp_path / 'runs'))} "
           f"{shlex.quote(str(exe))} presets/local-demo.yaml; echo EXITED=$?; sleep 30")
    tmux("new-session", "-d", "-s", session, "-x", "140", "-y", "44", cmd)
    try:
        wait_for(session, "Nodes: the machines of this run", "localhost", "F2 SSH")
        tmux("send-keys", "-t", session, "F2")
        wait_for(session, "SSH: qwen-tui logs into every node", "Every node is this machine")
        tmux("send-keys", "-t", session, "F1")
        wait_for(session, "Nodes: the machines of this run")
        tmux("send-keys", "-t", session, "a")
        wait_for(session, "Add node")
        tmux("send-keys", "-t", session, "-l", "gpu-node-9")
        wait_for(session, "gpu-node-9")  # typed into the form's first field, which has focus
        tmux("send-keys", "-t", session, "C-s")
        deadline = time.monotonic() + 20
        while "Add node" in tmux("capture-pane", "-p", "-t", session) and time.monotonic() < deadline:
            time.sleep(0.2)
        s = wait_for(session, "gpu-node-9")
        assert "Add node" not in s  # the form closed; the table has the new row
        tmux("send-keys", "-t", session, "C-q")
        wait_for(session, "Quit without saving?")  # the preset changed: asks first
        tmux("send-keys", "-t", session, "y")
        wait_for(session, "EXITED=0")
    finally:
        end_session(session)
