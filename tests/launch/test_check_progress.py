"""The node checks report as they go: api.checking yields each node's outcome (CheckProgress)
before the result, and `qwen-tui check` on a terminal shows a line per node that changes as
its checks finish, then the matrix. Real probes and port checks on this machine."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.preset.files import load_preset
from qwen_tui.run import api
from support.paths import DEMO, ROOT
from support.ports import free_port
from support.tmux import end_session, tmux, wait_for


def _free_port_copy(tmp_path: Path, host1: str = "localhost") -> Path:
    """The demo preset on a free master port (the demo's may be busy with another run here)."""
    d = yaml.safe_load(DEMO.read_text())
    d["cluster"]["nodes"][1]["host"] = host1
    d["network"]["master_port"] = free_port()
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_checking_streams_each_nodes_outcome_before_the_result(tmp_path):
    p = load_preset(_free_port_copy(tmp_path))
    ts = {0: LocalTransport(), 1: LocalTransport()}
    assert [type(e) for e in api.checking(p, ts, local_python=sys.executable)] == [api.Checked]  # launch: port only
    evs = list(api.checking(p, ts, local_python=sys.executable, rehearsal=False, on_one_machine=True))
    assert isinstance(evs[-1], api.Checked) and evs[-1].result.checks is not None
    progress = [e for e in evs if isinstance(e, api.CheckProgress)]
    assert {(e.check, e.node) for e in progress} >= {("probe", None), ("probe", 0), ("probe", 1), ("port", 1)}
    assert "rehearsal" not in {e.check for e in progress}
    rep = evs[-1].result.checks
    assert rep.verdict(0, "python") == "ok" and rep.verdict(1, "port") == "ok"


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_check_on_a_terminal_shows_a_live_line_per_node(tmp_path):
    """Everything the check writes to the terminal is recorded (tmux pipe-pane, attached before the check starts),
    so the live line's changes are read in order, however fast they come and however busy the machine is."""
    session = f"qc-{uuid.uuid4().hex[:8]}"
    p = _free_port_copy(tmp_path)
    go, stream = tmp_path / "go", tmp_path / "terminal.out"
    cmd = (f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.1; done; stty cols 150 rows 40; "
           f"cd {shlex.quote(str(ROOT))} && PYTHONPATH={shlex.quote(str(ROOT))} "
           f"{shlex.quote(sys.executable)} -m qwen_tui.cli check {shlex.quote(str(p))} --no-rehearsal "
           "--bandwidth-seconds 1; echo EXITED=$?; sleep 30")
    tmux("new-session", "-d", "-s", session, "-x", "150", "-y", "40", cmd)
    try:
        tmux("pipe-pane", "-t", session, "-o", f"cat >> {shlex.quote(str(stream))}")
        go.touch()
        # while it runs: the check now, and each node's line with what finished (ssh) and what runs
        s = wait_for(session, "0 localhost", "1 localhost", "✔ ssh", timeout=60)
        assert "… " in s and "qwen-tui check /" not in s
        s = wait_for(session, "EXITED=", timeout=120)
        assert "EXITED=0" in s and "all checks passed" in s
        assert "✔ ssh" not in s  # the live lines are gone; the matrix stays
        raw = stream.read_text(encoding="utf-8", errors="replace")
        # the line changed as the checks finished: probe, then port, then bandwidth (measured, or not on a busy
        # machine: its mark may be either), all before the matrix (whose title wraps before the preset's path when
        # the table is narrower than the path: a long temp dir)
        order = [m.start() if m else -1 for m in (re.search(x, raw) for x in
                                                   ("✔ probe", "✔ port", "[✔✘] bandwidth",
                                                    r"qwen-tui check(\s|\x1b\[[0-9;]*m)+/"))]
        assert -1 not in order and order == sorted(order), order
    finally:
        end_session(session)


def test_check_with_an_unreachable_node_prints_its_matrix_and_exits_1(tmp_path):
    """"not checked" has no colour of its own: the matrix once crashed on it (a rich MarkupError). The matrix fits
    a terminal of 100 columns with every check's name whole."""
    import os

    from qwen_tui.cli.check import HEADERS
    from qwen_tui.nodes.checks.runner import COLUMNS

    p = _free_port_copy(tmp_path, host1="node-gone.invalid")
    r = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "check", str(p), "--no-rehearsal"], cwd=ROOT,
                       capture_output=True, text=True, timeout=180,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"})
    assert r.returncode == 1, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    lines = r.stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("node "))
    assert head.split() == ["node"] + [HEADERS.get(c, c) for c in COLUMNS if c != "container"], head  # no container
    table = lines[lines.index(head):]
    table = table[:next(i for i, ln in enumerate(table) if ln.startswith("✔ ok"))]
    assert all(len(ln.rstrip()) <= 100 for ln in table) and "…" not in head, table
    row = next(ln for ln in table if ln.startswith("1 node-gone.invalid "))  # the label whole
    assert "✘" in row and row.count("?") >= 10, row
    assert "ssh       1 node-gone.invalid cannot connect" in r.stdout  # its progress line, before the matrix
    assert re.search(r"^error +node-gone\.invalid +UNREACHABLE: ", r.stdout, re.M), r.stdout
    assert re.search(r"^\d+ error\(s\)$", r.stdout, re.M), r.stdout
