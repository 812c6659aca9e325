"""The wizard's SSH step against real sshd nodes: a fresh key made and installed with a
password typed once into the masked prompt, every new host key shown and accepted only
by the user, then passwordless logins between all pairs; refusing a host key installs nothing."""

from __future__ import annotations

import asyncio
import time

import pytest
from textual.widgets import Input

from qwen_tui.preset.schema import Preset
from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.modals import Confirm, PasswordPrompt
from support.cluster import PASSWORD, preset_dict

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _preset(cluster, sshdir, tmp_path) -> Preset:
    d = preset_dict(cluster, sshdir)
    d["cluster"]["identity_file"] = str(tmp_path / "wizard_key")  # a key that does not exist yet
    d["cluster"]["known_hosts"] = str(tmp_path / "known_hosts")  # every host key is new
    return Preset.model_validate(d)


async def _drive(app, pilot, answer: str, deadline_s: float = 120.0) -> list[str]:
    """Type the password once, then answer every host-key question; until the step is done."""
    await pilot.press("f2", "k")
    await pilot.pause()
    assert isinstance(app.screen, PasswordPrompt)
    field = app.screen.query_one("#password", Input)
    assert field.password  # masked
    field.value = PASSWORD
    await pilot.press("enter")
    asked: list[str] = []
    deadline = time.monotonic() + deadline_s
    while app.state.key_report is None and time.monotonic() < deadline:
        await pilot.pause(0.2)
        if isinstance(app.screen, Confirm):
            asked.append(app.screen.body)
            await pilot.press(answer)
    await asyncio.sleep(0)
    assert app.state.key_report is not None, "the key step did not finish"
    return asked


async def test_wizard_installs_key_after_accepting_each_host_key(cluster, sshdir, keyed, tmp_path):
    p = _preset(cluster, sshdir, tmp_path)
    app = WizardApp(preset=p, reattach=False, base_dir=str(tmp_path), runs_root=str(tmp_path / "runs"))
    async with app.run_test(size=(160, 50)) as pilot:
        asked = await _drive(app, pilot, "y")
        rep = app.state.key_report
        assert rep.ok, rep.matrix_lines([n.label for n in p.cluster.nodes])
        assert len(asked) >= len(p.cluster.nodes)  # one question per new host key, none skipped
        assert all("SHA256:" in q and "never seen" in q for q in asked)
        assert (tmp_path / "wizard_key").exists() and (tmp_path / "wizard_key").stat().st_mode & 0o777 == 0o600
        lines = (tmp_path / "known_hosts").read_text().splitlines()
        assert len(lines) == len(p.cluster.nodes)
        assert all((a, b) in rep.matrix for a in range(3) for b in range(3) if a != b)
    # the password is nowhere on disk
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert PASSWORD.encode() not in f.read_bytes(), f


async def test_wizard_refusing_host_keys_installs_nothing(cluster, sshdir, keyed, tmp_path):
    p = _preset(cluster, sshdir, tmp_path)
    app = WizardApp(preset=p, reattach=False, base_dir=str(tmp_path), runs_root=str(tmp_path / "runs"))
    async with app.run_test(size=(160, 50)) as pilot:
        asked = await _drive(app, pilot, "n")
        rep = app.state.key_report
        assert asked and not rep.ok
        assert not (tmp_path / "known_hosts").exists() or (tmp_path / "known_hosts").read_text().strip() == ""
        assert all(isinstance(v, BaseException) for v in rep.installed.values())
