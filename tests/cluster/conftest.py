"""One namespace cluster for the whole cluster test session.

The fixture fails (never skips) when it cannot bring the cluster up: CI runs
these tests as root and must notice when they did not run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cluster import N_NODES, PASSWORD, preset_dict
from support.netns import NetnsCluster
from qwen_tui.preset.schema import Preset


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = NetnsCluster(tmp_path_factory.mktemp("nodes"), N_NODES, password=PASSWORD)
    try:
        c.up()
        yield c
    finally:
        c.down()


@pytest.fixture(scope="session")
def sshdir(cluster, tmp_path_factory) -> Path:
    """This machine's ssh files for the session: config (aliases node0..), key, known_hosts."""
    d = tmp_path_factory.mktemp("ssh")
    lines = []
    for n in cluster.nodes:
        lines += [f"Host {n.hostname}", f"    HostName {n.addr}", "    User root", "    Port 22",
                  f"    IdentityFile {d / 'id_ed25519'}", "    ConnectTimeout 5", ""]
    (d / "config").write_text("\n".join(lines))
    return d


@pytest.fixture(scope="session")
def keyed(cluster, sshdir):
    """Key setup from password-only nodes, once per session; yields the first report."""
    from qwen_tui.nodes.keys import setup_keys
    from qwen_tui.nodes.ssh import AuthFailed, SSHTransport
    from qwen_tui.nodes.connect import _ssh_config, resolve_target

    preset = Preset.model_validate(preset_dict(cluster, sshdir))
    # Before: the nodes take a password and nothing else.
    t = resolve_target(preset.cluster.nodes[0], preset, _ssh_config(preset))
    t.identity_files, t.look_for_keys = [], False
    with pytest.raises(AuthFailed):
        SSHTransport(t, accept_new_host_keys=True).connect()
    report = setup_keys(preset, PASSWORD, accept_new_host_keys=True)
    return report


@pytest.fixture
def preset(cluster, sshdir, keyed) -> Preset:
    return Preset.model_validate(preset_dict(cluster, sshdir))
