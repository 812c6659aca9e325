"""Fixtures of the wizard tests: the local-demo preset copied with a free port, the anyio backend for Pilot,
and a safety net that stops what a failing test left running."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from support.paths import DEMO
from support.ports import free_port


@pytest.fixture
def demo_copy(tmp_path):
    def make(monitor: dict | None = None, **training) -> Path:
        data = yaml.safe_load(DEMO.read_text())
        data["network"]["master_port"] = free_port()
        data["training"]["output_dir"] = str(tmp_path / "out")
        data["training"].update(training)
        if monitor:
            data["monitor"] = monitor
        p = tmp_path / "demo.yaml"
        p.write_text(yaml.safe_dump(data, sort_keys=False))
        return p
    return make


@pytest.fixture
def anyio_backend():
    # Pilot tests are async; anyio's pytest plugin runs them (no pytest-asyncio needed)
    return "asyncio"


@pytest.fixture
def stop_runs_after():
    """Safety net: whatever a failing test leaves running in these run roots is stopped."""
    roots: list[Path] = []
    yield roots.append
    import json

    from qwen_tui.nodes.transport.local import LocalTransport
    from qwen_tui.nodes.transport.protocol import stop_group

    for root in roots:
        for pids in Path(root).glob("*/pids.json"):
            for pid in json.loads(pids.read_text()).values():
                stop_group(LocalTransport(), int(pid), grace=5)
