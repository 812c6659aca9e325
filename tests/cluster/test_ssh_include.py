"""A node defined only in an Include'd ssh_config file is reached with its own user and port, both
when OpenSSH resolves it (`ssh -G`) and when paramiko reads the file with its Includes expanded
(a machine without an ssh client)."""

from __future__ import annotations

import socket

import pytest

from qwen_tui.nodes.connect import _ssh_config, close_all, connect_all, resolve_target
from qwen_tui.nodes.transport import sshconfig
from qwen_tui.preset.schema import Preset
from support.cluster import preset_dict
from support.login_user import LOGIN, LoginUser

PORT = 2202


@pytest.fixture
def login(cluster, sshdir, keyed):
    u = LoginUser(cluster, sshdir).add()
    yield u
    u.remove()


@pytest.fixture
def node1_on_its_own_port(cluster):
    """node1's sshd answers on PORT (redirected to its port 22 inside the node); a connection from this
    machine to port 22 itself is dropped, so only a client that uses PORT gets in."""
    cluster.ns(1, "iptables", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", str(PORT),
               "-j", "REDIRECT", "--to-ports", "22")
    cluster.ns(1, "iptables", "-A", "INPUT", "-p", "tcp", "-s", cluster.host_addr, "-m", "conntrack",
               "--ctorigdstport", "22", "-j", "DROP")
    try:
        with pytest.raises(OSError):  # the situation under test: port 22 itself is closed to us
            socket.create_connection((cluster.nodes[1].addr, 22), timeout=1).close()
        socket.create_connection((cluster.nodes[1].addr, PORT), timeout=5).close()
        yield
    finally:
        cluster.ns(1, "iptables", "-t", "nat", "-F")
        cluster.reset_firewall(1)


def _config(cluster, sshdir, tmp_path) -> str:
    """config: `Include conf.d/*.conf` first, then the session's blocks for every node but node1;
    node1 lives only in conf.d/node1.conf, with the login user and its own port."""
    inc = tmp_path / "conf.d"
    inc.mkdir()
    n1 = cluster.nodes[1]
    (inc / "node1.conf").write_text(f"Host {n1.hostname}\n    HostName {n1.addr}\n    User {LOGIN}\n"
                                    f"    Port {PORT}\n    IdentityFile {sshdir / 'id_ed25519'}\n"
                                    "    ConnectTimeout 5\n")
    blocks = (sshdir / "config").read_text().split("\n\n")
    rest = [b for b in blocks if b.strip() and not b.startswith(f"Host {n1.hostname}\n")]
    assert len(rest) == len(cluster.nodes) - 1
    main = tmp_path / "config"
    main.write_text(f"Include {inc}/*.conf\n\n" + "\n\n".join(rest) + "\n")
    known = tmp_path / "known_hosts"
    kt, b64 = cluster.host_key_line(1).split()[1:]
    known.write_text((sshdir / "known_hosts").read_text() + f"[{n1.addr}]:{PORT} {kt} {b64}\n")
    return str(main)


@pytest.mark.parametrize("reader", ["ssh -G", "paramiko+Include"])
def test_a_node_defined_in_an_included_file_is_reached_with_its_own_user_and_port(
        cluster, sshdir, keyed, login, node1_on_its_own_port, tmp_path, monkeypatch, reader):
    if reader == "paramiko+Include":
        monkeypatch.setattr(sshconfig, "ssh_client", lambda: None)  # a machine without an ssh client
    d = preset_dict(cluster, sshdir)
    d["cluster"]["ssh_config"] = _config(cluster, sshdir, tmp_path)
    d["cluster"]["known_hosts"] = str(tmp_path / "known_hosts")
    preset = Preset.model_validate(d)
    config = _ssh_config(preset)
    assert isinstance(config, sshconfig.OpenSSHConfig if reader == "ssh -G" else sshconfig.ParamikoConfig)
    target = resolve_target(preset.cluster.nodes[1], preset, config)
    assert (target.user, target.hostname, target.port) == (LOGIN, cluster.nodes[1].addr, PORT)

    conns = connect_all(preset)
    try:
        assert conns.ok, conns.errors_text()
        who = {i: conns[i].run(["sh", "-c", "hostname; id -un"], timeout=10).stdout.split() for i in range(3)}
    finally:
        close_all(conns)
    assert who == {0: ["node0", "root"], 1: ["node1", LOGIN], 2: ["node2", "root"]}
