"""One namespace cluster for the whole cluster test session.

The fixture fails (never skips) when it cannot bring the cluster up: CI runs
these tests as root and must notice when they did not run.

After the last cluster test of the session, whatever order the tests ran in, no
file the runs, the checks, the key setup or their logs wrote may hold the nodes'
password (`pytest_runtest_teardown` below scans them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen_tui.preset.schema import Preset
from support.cluster import N_NODES, PASSWORD, REPO, files_holding, preset_dict
from support.netns import NetnsCluster

HERE = Path(__file__).parent
# The session's base temp dir, once the cluster is up: what the password scan reads.
_session: dict[str, Path] = {}


def _in_here(item) -> bool:
    return Path(str(item.fspath)).is_relative_to(HERE)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _in_here(item):
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down: what they write is scanned too
def pytest_runtest_teardown(item, nextitem):
    """Once no cluster test follows (the last one of the session, in any order): no file under the session's
    temp dir (node homes, sshd logs, run dirs, logs, known_hosts, presets, check results) or the checkout's
    .qwen-tui/ and runs/ holds the password. A hit fails the teardown of that last test."""
    if "basetemp" not in _session or (nextitem is not None and _in_here(nextitem)):
        return
    scanned, hits = files_holding(PASSWORD.encode(), [_session["basetemp"], REPO / ".qwen-tui", REPO / "runs"])
    assert scanned > 20, f"the password scan read only {scanned} files"
    assert hits == [], f"the nodes' password is written in {hits}"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = NetnsCluster(tmp_path_factory.mktemp("nodes"), N_NODES, password=PASSWORD)
    _session["basetemp"] = tmp_path_factory.getbasetemp()
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
    from qwen_tui.nodes.connect import _ssh_config, resolve_target
    from qwen_tui.nodes.keys import setup_keys
    from qwen_tui.nodes.transport.ssh import AuthFailed, SSHTransport

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


@pytest.fixture(scope="session")
def slurm(cluster):
    """A real SLURM on the session's cluster (support/slurm.py): slurmctld on node 0, a slurmd per node."""
    from support.slurm import Slurm

    s = Slurm(cluster)
    try:
        s.up()
        yield s
    finally:
        s.down()


@pytest.fixture(scope="module")
def podman(cluster, tmp_path_factory):
    """podman on every node, its own store holding the worker image (built if .ci/run has not): (the nodes, the
    image's tag). No container may be left when the module ends."""
    from support.podman_nodes import PodmanNodes, build_image

    tag = build_image()
    nodes = PodmanNodes(cluster, tmp_path_factory.mktemp("podman")).up()
    try:
        yield nodes, tag
    finally:
        left = {i: nodes.containers(i) for i in range(len(cluster.nodes))}
        nodes.down()
        assert not any(left.values()), f"containers left on the nodes: {left}"


@pytest.fixture(scope="module")
def field(cluster, sshdir, keyed):
    """The cluster as a login user meets it (support/field_run.py): replay as that user, faults on its nodes."""
    from support.field_run import FieldCluster

    f = FieldCluster(cluster, sshdir)
    try:
        yield f
    finally:
        f.close()
