"""`qwen-tui check` reports only what it looked at: a check that could not run says
"not checked" with the reason, it probes the interpreter replay would run, and it
changes nothing on disk. Real probes on this machine (local nodes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from qwen_tui.nodes.checks.runner import run_checks
from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.preset.schema import Preset
from support.paths import DEMO, ROOT


def _preset(**node1) -> Preset:
    d = yaml.safe_load(DEMO.read_text())
    d["cluster"]["nodes"][1].update(node1)
    return Preset.model_validate(d)


def test_an_unreachable_node_is_not_checked_rather_than_missing_torch():
    p = _preset(host="node-gone.invalid")
    rep = run_checks(p, {0: LocalTransport()}, connect_errors={1: ConnectionError("node-gone.invalid: unreachable")},
                     network=False)
    codes = {f.code for f in rep.findings if f.node == 1}
    assert codes == {"UNREACHABLE"}, codes
    for c in ("python", "gpu", "code", "disk", "data", "model"):
        assert rep.verdict(1, c) == "not checked", c
    assert rep.to_dict()["not_checked"]["node-gone.invalid"]["python"] == "the node is unreachable"
    assert rep.verdict(0, "python") == "ok"


def test_a_node_without_its_python_shows_no_ok_for_what_was_not_probed(tmp_path):
    p = _preset(python=str(tmp_path / "no-such-python"))
    rep = run_checks(p, {0: LocalTransport(), 1: LocalTransport()}, network=False)
    assert rep.verdict(1, "python") == "error"
    assert {f.code for f in rep.findings if f.node == 1} == {"PYTHON_MISSING"}
    for c in ("gpu", "code", "disk"):
        assert rep.verdict(1, c) == "not checked", c
        assert rep.verdict(0, c) in ("ok", "warning"), c


def test_check_probes_the_interpreter_replay_runs_and_creates_nothing(tmp_path):
    # python3 on PATH is an interpreter without torch (no site-packages), as with the venv not activated
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    (bindir / "python3").chmod(0o755)
    assert subprocess.run([str(bindir / "python3"), "-c", "import torch"], capture_output=True).returncode != 0
    work = tmp_path / "work"
    work.mkdir()
    d = yaml.safe_load(DEMO.read_text())
    d["training"]["output_dir"] = str(tmp_path / "deep" / "new" / "out")
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "check", str(p), "--json", "--no-rehearsal"],
                         cwd=work, capture_output=True, text=True, timeout=300, env=env)
    data = json.loads(res.stdout)
    codes = {f["code"] for f in data["findings"]}
    assert "TORCH_MISSING" not in codes and "CODE_MISSING" not in codes, data["findings"]
    assert not (tmp_path / "deep").exists()
    assert list(work.iterdir()) == []


def test_user_values_in_findings_are_never_markup_or_terminal_codes(tmp_path):
    d = yaml.safe_load(DEMO.read_text())
    d["training"]["data"] = "data[/x]\x1b[2J.jsonl"  # rich markup and an escape sequence in a path
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250"}
    for args in (["check", str(p), "--no-rehearsal"], ["replay", str(p)]):
        res = subprocess.run([sys.executable, "-m", "qwen_tui.cli", *args], cwd=tmp_path, capture_output=True,
                             text=True, timeout=300, env=env)
        out = res.stdout + res.stderr
        assert res.returncode == 1, out[-2000:]  # the data file is missing: an error, not a crash
        assert "Traceback" not in out and "\x1b[2J" not in out
        assert "data[/x]\\x1b[2J.jsonl" in out, out[-2000:]
