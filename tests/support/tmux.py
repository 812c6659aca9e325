"""The app in a real terminal: a tmux session driven key by key, its screen read as text, and what a failed
test left running stopped. Shared by the tmux tests (tests/ui/test_tmux*.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.procs import run_processes


def _server(args: tuple[str, ...]) -> list[str]:
    """`-L SESSION`: each session on a tmux server of its own. tmux keeps one server per user that exits with its
    last session, and a new-session that reaches it while it exits fails ("server exited unexpectedly"), however
    the tests take turns; servers of their own never meet."""
    flag = "-s" if "-s" in args else "-t"
    return ["-L", args[args.index(flag) + 1]]


def tmux(*args: str) -> str:
    """`tmux ARGS` on the server of the session that ARGS name (-s or -t)."""
    return subprocess.run(["tmux", *_server(args), *args], check=True, capture_output=True, text=True,
                          timeout=10).stdout


def end_session(session: str) -> None:
    """The session and its server gone, whatever state the test left them in."""
    subprocess.run(["tmux", "-L", session, "kill-server"], capture_output=True, timeout=10)
    # the server leaves its socket file behind
    (Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}" / session).unlink(missing_ok=True)


def wait_for(session: str, *texts: str, timeout: float = 20.0) -> str:
    """The screen once every one of `texts` is on it (a screen is drawn in parts: its title can come first)."""
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux("capture-pane", "-p", "-t", session)
        if all(t in screen for t in texts):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{texts!r} not all on screen after {timeout:g}s:\n{screen}")


def screen(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session)


def keys(session: str, *ks: str, pause: float = 0.3) -> None:
    """Key by key, as a person types: a key sent while a step still mounts is not lost in a batch."""
    for k in ks:
        tmux("send-keys", "-t", session, k)
        time.sleep(pause)


def type_into(session: str, text: str) -> None:
    """Replace the focused input's value: End, C-u and the text in one write, as a busy machine delivers what a
    person typed (the app must keep their order)."""
    tmux("send-keys", "-t", session, "End", "C-u", *text)
    time.sleep(0.3)


def stop_leftovers(runs: Path) -> None:
    """A failed test must leave no training behind: stop every run it started, then any straggler."""
    exe = Path(sys.executable).with_name("qwen-tui")
    for rd in sorted(runs.glob("*/")) if runs.is_dir() else []:
        subprocess.run([str(exe), "attach", str(rd), "--stop"], capture_output=True, timeout=60,
                       env={**os.environ, "QWEN_TUI_RUNS": str(runs)})
        for pid in run_processes(rd.name):
            os.kill(pid, signal.SIGKILL)
