"""The Nodes step's import (`i`) reads the preset's ssh_config with its Includes expanded: hosts
defined only in included files, and the `Host=x` spelling, become nodes."""

from __future__ import annotations

import pytest
import yaml
from textual.widgets import Select

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.modals import ImportNodes

pytestmark = pytest.mark.anyio
SIZE = (140, 44)


async def test_the_host_import_offers_hosts_of_included_files(tmp_path, demo_copy):
    inc = tmp_path / "conf.d"
    inc.mkdir()
    (inc / "10-gpu.conf").write_text("Host gpu1 gpu2\n    User train\n")
    (inc / "20-more.conf").write_text("Host=gpu3\n    Port 2203\nHost *.internal\n    User x\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Include {inc}/*.conf\nHost bastion\n    HostName 192.0.2.1\n")
    path = demo_copy()
    data = yaml.safe_load(path.read_text())
    data["cluster"]["ssh_config"] = str(cfg)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    app = WizardApp(str(path), runs_root=str(tmp_path / "runs"), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("i")
        await pilot.pause()
        assert isinstance(app.screen, ImportNodes)
        app.screen.query_one("#kind", Select).value = "ssh_config"
        await pilot.pause()
        assert "gpu3" in app.screen.query_one("#text").text
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("r")  # replace the nodes there (it asks: replace or add after)
        await pilot.pause()
        assert [n.host for n in app.state.preset.cluster.nodes] == ["gpu1", "gpu2", "gpu3", "bastion"]
