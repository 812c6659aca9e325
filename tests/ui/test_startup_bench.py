"""bench/startup_time.py: the wizard's first paint beside an empty Textual app measured at the same
time, the machine's load with it, and an idle reference recorded only when the machine is idle."""

from __future__ import annotations

import importlib.util
import json

from support.paths import ROOT


def bench():
    spec = importlib.util.spec_from_file_location("startup_time", ROOT / "bench" / "startup_time.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reports_both_medians_and_the_load_and_records_idle_only_when_idle(tmp_path, monkeypatch, capsys):
    mod = bench()
    monkeypatch.setattr(mod, "IDLE_FILE", tmp_path / "startup_idle.json")
    monkeypatch.setattr(mod, "load_per_core", lambda: 3.0)  # a busy machine
    assert mod.main(["--runs", "1", "--record-idle"]) == 2
    assert "not recorded as idle: load 3.0" in capsys.readouterr().err
    assert not (tmp_path / "startup_idle.json").exists()
    assert mod.main(["--runs", "1", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["wizard_ms"] > 0 and m["reference_ms"] > 0 and m["extra_ms"] == m["wizard_ms"] - m["reference_ms"]
    assert m["load_per_core"] == 3.0 and m["idle"] is None
    monkeypatch.setattr(mod, "load_per_core", lambda: 0.1)
    assert mod.main(["--runs", "1", "--record-idle"]) == 0
    out = capsys.readouterr().out
    assert "idle reference (" in out and "(idle)" in out
    assert json.loads((tmp_path / "startup_idle.json").read_text())["load_per_core"] == 0.1
