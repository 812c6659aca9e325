"""The launch API (qwen_tui.run.api) driven as a face drives it, on the demo preset's two local nodes."""

from __future__ import annotations

import sys

import yaml

from qwen_tui.preset.files import load_preset
from qwen_tui.preset.schema import Preset
from qwen_tui.run import api
from support.paths import DEMO, ROOT
from support.ports import free_port


def demo(tmp_path, **training) -> Preset:
    data = yaml.safe_load(DEMO.read_text())
    data["network"]["master_port"] = free_port()
    data["training"].update(training)
    data["training"]["output_dir"] = str(tmp_path / "out")
    p = tmp_path / "demo.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_preset(p)


def request(tmp_path, preset, run_id="r1", **kw) -> api.LaunchRequest:
    return api.LaunchRequest(preset, tmp_path / "runs", run_id, base_dir=str(ROOT), local_python=sys.executable, **kw)


def launch_until_started(req, conns) -> list:
    events = list(api.launch(req, conns))
    assert isinstance(events[-1], api.Started), events
    return events
