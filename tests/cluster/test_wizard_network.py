"""The wizard's Network step on the namespace cluster: each check runs again on its own
key (b: bandwidth, p: ports, f: firewall) through the core check functions, and only
what that check measures changes on the screen."""

from __future__ import annotations

import time

import pytest
from textual.geometry import Region
from textual.widgets import DataTable

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.screens.network import NetworkScreen
from qwen_tui.ui.widgets.bandwidth import BandwidthBars

pytestmark = pytest.mark.anyio

PORT_COL = 4  # "#", "node", "interface", "addresses", "master port", "firewall"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _text(widget) -> str:
    w, h = widget.size
    return "\n".join("".join(seg.text for seg in strip) for strip in widget.render_lines(Region(0, 0, w, h)))


def _port_cells(screen) -> list[str]:
    t = screen.query_one(DataTable)
    return [str(t.get_row_at(r)[PORT_COL]) for r in range(t.row_count)]


async def _wait(pilot, pred, bound: float) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if pred():
            return True
        await pilot.pause(0.2)
    return pred()


async def test_rerun_one_network_check_at_a_time(cluster, preset, tmp_path):
    app = WizardApp(preset=preset, reattach=False, base_dir=str(tmp_path), runs_root=str(tmp_path / "runs"))
    said: list[str] = []  # every notification, for the failure message (they expire on screen)
    notify = app.notify
    app.notify = lambda message, **kw: (said.append(str(message)), notify(message, **kw))[1]
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.press("f3")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, NetworkScreen)
        # each check has its own key, shown in the footer
        keys = {b.key: b.description for b in screen.BINDINGS}
        assert keys == {"r": "All checks", "p": "Ports", "f": "Firewall", "b": "Bandwidth", "s": "Sync"}
        footer = app.export_screenshot().replace("&#160;", " ")
        assert all(d in footer for d in keys.values())
        assert _port_cells(screen) == ["not checked"] * 3
        st = app.state

        # 1. bandwidth only: the per-worker bars fill, the port column stays untouched
        await pilot.press("b")
        assert await _wait(pilot, lambda: all(st.facts.links.get(i) and st.facts.links[i].bandwidth_gbps
                                              for i in (1, 2)), 120), (st.facts.links, said)
        await pilot.pause(0.3)
        bars = _text(screen.query_one(BandwidthBars))
        for label in ("node1", "node2"):
            row = next(ln for ln in bars.splitlines() if ln.strip().startswith(label))
            assert "█" in row and "Gbit/s" in row and "not measured" not in row, bars
        assert _port_cells(screen) == ["not checked"] * 3
        assert st.facts.master_port_free is None
        assert all(lk.port_reachable is None and lk.port_error is None for lk in st.facts.links.values())
        assert {f.check for f in st.net_findings} == {"bandwidth"}, [(f.code, f.message) for f in st.net_findings]
        measured = {i: st.facts.links[i].bandwidth_gbps for i in (1, 2)}

        # 2. ports only: the port column fills; the bandwidth measured before stays as it was
        await pilot.press("p")
        assert await _wait(pilot, lambda: st.facts.master_port_free is not None and all(
            st.facts.links[i].port_reachable is not None for i in (1, 2)), 40), \
            (st.facts.links, said, [(f.code, f.message) for f in st.net_findings])
        await pilot.pause(0.3)
        assert _port_cells(screen) == ["✔ free here", "✔ reachable", "✔ reachable"]
        assert {i: st.facts.links[i].bandwidth_gbps for i in (1, 2)} == measured
        assert {f.check for f in st.net_findings} == {"bandwidth"}  # no port problem, bandwidth kept
        assert not st.net_checked  # only `r` marks the whole step as checked
        bars2 = _text(screen.query_one(BandwidthBars))
        assert bars2 == bars


async def test_all_checks_show_each_node_as_it_is_checked(cluster, preset, tmp_path):
    """`r` takes seconds on three nodes: the step says which check runs and each node's outcome as it
    comes, and the progress lines go once the results are in the table."""
    app = WizardApp(preset=preset, reattach=False, base_dir=str(tmp_path), runs_root=str(tmp_path / "runs"))
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.press("f3")
        await pilot.pause()
        screen = app.screen
        seen: list = []
        show = screen._show_progress
        screen._show_progress = lambda line: (seen.append(line), show(line))[1]
        await pilot.press("r")
        assert await _wait(pilot, lambda: len([s for s in seen if s]) >= 2, 30), seen
        assert str(screen.query_one("#net-progress").render()).strip()  # on screen while it runs
        assert await _wait(pilot, lambda: app.state.net_checked, 180), seen
        await pilot.pause()
        lines = [s for s in seen if s]
        for i in range(3):
            assert any(f"probe: node {i} (node{i}): probed" in s for s in lines), lines
        assert any("port: node 2 (node2): reaches the master port" in s for s in lines), lines
        assert any(s.startswith("… bandwidth") for s in lines) and any("Gbit/s" in s for s in lines), lines
        assert seen[-1] is None and not str(screen.query_one("#net-progress").render()).strip()
