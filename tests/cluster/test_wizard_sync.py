"""The wizard's Network step syncs from the master (`s`) on the namespace cluster: what a node lacks is
copied and verified, a copy that differs is replaced only after a yes."""

from __future__ import annotations

import shutil
import time

import pytest

from qwen_tui.preset.schema import Preset
from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.modals import Confirm, Notice
from qwen_tui.ui.screens.network import NetworkScreen
from support.cluster import preset_dict

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def _wait(pilot, pred, bound: float) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if pred():
            return True
        await pilot.pause(0.2)
    return pred()


async def test_s_on_the_network_step_copies_what_nodes_lack_and_replaces_a_different_copy_after_a_yes(
        cluster, sshdir, keyed, tmp_path):
    rel = "qt-wsync"
    homes = [n.home for n in cluster.nodes]
    for h in homes:
        shutil.rmtree(h / rel, ignore_errors=True)
    data = b"".join(b'{"messages": [{"role": "user", "content": "w%d"}, {"role": "assistant", "content": "x"}]}\n'
                    % i for i in range(300))
    (homes[0] / rel).mkdir()
    (homes[0] / rel / "chat.jsonl").write_bytes(data)
    (homes[2] / rel).mkdir()
    (homes[2] / rel / "chat.jsonl").write_bytes(b'{"messages": []}\n')
    preset = Preset.model_validate(preset_dict(cluster, sshdir, data=f"~/{rel}/chat.jsonl"))
    app = WizardApp(preset=preset, reattach=False, base_dir=str(tmp_path), runs_root=str(tmp_path / "runs"))
    said: list[str] = []
    notify = app.notify
    app.notify = lambda message, **kw: (said.append(str(message)), notify(message, **kw))[1]
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.press("f3")
            await pilot.pause()
            assert isinstance(app.screen, NetworkScreen)
            await pilot.press("s")
            assert await _wait(pilot, lambda: isinstance(app.screen, Confirm), 120), said
            body = app.screen.body
            assert "node1 data: copied" in body and "node2 data: differs (left untouched)" in body, body
            assert (homes[1] / rel / "chat.jsonl").read_bytes() == data
            assert (homes[2] / rel / "chat.jsonl").read_bytes() == b'{"messages": []}\n'  # not without a yes
            await pilot.press("y")
            assert await _wait(pilot, lambda: isinstance(app.screen, Notice), 120), said
            assert "node2 data: copied" in app.screen.body and "node1 data: same" in app.screen.body
            assert (homes[2] / rel / "chat.jsonl").read_bytes() == data
            await pilot.press("enter")
            # closing the summary checks the nodes again: nothing is missing or different any more
            assert await _wait(pilot, lambda: app.state.net_checked, 180), said
            assert not [f for f in app.state.net_findings if f.code.startswith("DATA_")]
    finally:
        for h in homes:
            shutil.rmtree(h / rel, ignore_errors=True)
