"""Hostile values in a preset never execute anything: host names, users, paths,
interpreters and environment values travel as quoted argv elements."""

from __future__ import annotations

import uuid
from pathlib import Path

from qwen_tui.nodes.checks.runner import run_checks
from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.nodes.transport.protocol import stop_group
from qwen_tui.preset.schema import Preset
from support.cluster import preset_dict


def _payloads(tag: str) -> tuple[list[str], list[Path]]:
    marks = [Path(f"/tmp/qt-hostile-{tag}-{i}") for i in range(6)]
    vals = [f"x; touch {marks[0]}", f"$(touch {marks[1]})", f"`touch {marks[2]}`",
            f"a b' \"; touch {marks[3]}; '", f"|| touch {marks[4]} &&", f"\\$(touch {marks[5]})"]
    return vals, marks


def test_hostile_preset_values_execute_nothing(cluster, sshdir, keyed, tmp_path):
    vals, marks = _payloads(uuid.uuid4().hex[:8])
    d = preset_dict(cluster, sshdir, data=f"/tmp/{vals[1]}", model=f"./{vals[2]}",
                    output_dir=f"/tmp/{vals[0]}")
    nodes = d["cluster"]["nodes"]
    nodes[0]["workdir"] = f"/tmp/{vals[3]}"         # a real node, a hostile directory
    nodes[1]["python"] = f"python3 {vals[1]}"       # a real node, a hostile interpreter
    nodes[2]["user"] = vals[3]                       # a user name with spaces, quotes, ;
    nodes.append({"host": f"node1;touch {marks[0]}", "python": "python3"})  # a hostile host name
    d["network"]["env"] = {"QT_X": vals[4]}
    preset = Preset.model_validate(d)
    conns = connect_all(preset)
    try:
        assert isinstance(conns[2], Exception) and isinstance(conns[3], Exception)
        assert conns[0] is not None and not isinstance(conns[0], Exception)
        rep = run_checks(preset, dict(conns.succeeded), connect_errors=conns.failed, network=False)
        codes = {(f.node, f.code) for f in rep.errors}
        assert (0, "WORKDIR_MISSING") in codes and (1, "PYTHON_MISSING") in codes
        assert {(2, "UNREACHABLE"), (3, "UNREACHABLE")} <= codes

        # a detached job whose argv, env and paths carry the payloads runs them as plain strings
        t = conns[1]
        log = str(tmp_path / vals[0].replace("/", "_") / "job.log")
        pid = t.start_job(["printf", "%s\\n", *vals], env={"QT_X": vals[1]}, cwd=str(tmp_path),
                          log=log, rcfile=log + ".rc")
        assert stop_group(t, pid, grace=5)
        for _ in range(50):
            if Path(log + ".rc").exists():
                break
            __import__("time").sleep(0.1)
        assert Path(log).read_text().splitlines() == vals
        r = t.run(["sh", "-c", 'printf "%s|" "$QT_X" "$1"', "sh", vals[2]], env={"QT_X": vals[3]},
                  cwd=str(tmp_path), timeout=10)
        assert r.stdout == f"{vals[3]}|{vals[2]}|"
    finally:
        close_all(conns)
    for m in marks:
        assert not m.exists(), f"{m} was created: a value was executed"
    assert not Path("/tmp/qt-pwned").exists()  # the session password's own payload
