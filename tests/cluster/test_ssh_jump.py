"""ssh_config ProxyJump against real sshd servers: node2 refuses SSH from this machine and is reached
through node1, as `ssh -J node1 node2` would reach it."""

from __future__ import annotations

import time

import pytest

from qwen_tui.nodes.connect import _ssh_config, connect_all, resolve_target, transport_for
from qwen_tui.nodes.transport.hostkeys import UnknownHostKey
from qwen_tui.nodes.transport.ssh import SSHTransport, Unreachable
from qwen_tui.preset.schema import Preset
from support.cluster import preset_dict


def _config_with(sshdir, tmp_path, **extra_by_host) -> str:
    """The session's ssh config with extra lines in some hosts' blocks (first match wins, as in OpenSSH)."""
    out, host = [], None
    for line in (sshdir / "config").read_text().splitlines() + [""]:
        if line.startswith("Host "):
            host = line.split()[1]
        elif not line.strip() and host in extra_by_host:
            out += [f"    {x}" for x in extra_by_host.pop(host)]
        out.append(line)
    assert not extra_by_host, extra_by_host
    path = tmp_path / "config"
    path.write_text("\n".join(out) + "\n")
    return str(path)


@pytest.fixture
def node2_behind_node1(cluster):
    """SSH from this machine to node2 is dropped; node1 (and node0) still reach it."""
    cluster.ns(2, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-s", cluster.host_addr, "-j", "DROP")
    try:
        yield
    finally:
        cluster.reset_firewall(2)


def test_a_node_behind_a_jump_host_is_reached_through_it_and_only_through_it(cluster, sshdir, keyed, tmp_path,
                                                                           node2_behind_node1):
    direct = Preset.model_validate(preset_dict(cluster, sshdir))
    t0 = time.monotonic()
    with pytest.raises(Unreachable, match="node2.*timed out"):
        transport_for(direct.cluster.nodes[2], direct)
    assert time.monotonic() - t0 < 15  # bounded by connect_timeout 5

    d = preset_dict(cluster, sshdir)
    d["cluster"]["ssh_config"] = _config_with(sshdir, tmp_path, node2=["ProxyJump node1"])
    preset = Preset.model_validate(d)
    target = resolve_target(preset.cluster.nodes[2], preset, _ssh_config(preset))
    assert target.jump is not None and target.jump.hostname == cluster.nodes[1].addr
    assert target.address.endswith(f"via root@{cluster.nodes[1].addr}:22")

    conns = connect_all(preset)
    try:
        assert conns.ok, conns.errors_text()
        t = conns[2]
        r = t.run(["sh", "-c", 'hostname; echo "${SSH_CONNECTION%% *}"'], timeout=10)
        # node2's sshd saw the connection come from node1, not from this machine
        assert r.ok and r.stdout.split() == ["node2", cluster.nodes[1].addr], r
        assert conns[0]._jump is None and conns[1]._jump is None  # the others stay direct
        data = "".join(f"{i:06d} jump\n" for i in range(50_000)).encode()  # 600 kB each way through the hop
        assert t.run(["cat"], timeout=30, input=data).stdout.encode() == data
        src = tmp_path / "blob"
        src.write_bytes(data)
        t.put_file(str(src), "/tmp/qt-jump-blob", timeout=30)  # SFTP over the same hop
        assert t.read_file("/tmp/qt-jump-blob", limit=len(data) + 1) == data
        jump = t._jump
        assert jump is not None and jump._active()
    finally:
        for c in conns.values():
            if not isinstance(c, BaseException):
                c.close()
    assert t._jump is None and not jump._active()  # closing the node closes its hop


def test_jump_hosts_are_held_to_the_same_host_key_rules(cluster, sshdir, keyed, tmp_path, node2_behind_node1):
    # a known_hosts that knows node2 but not the jump host node1
    addr1 = cluster.nodes[1].addr
    known = tmp_path / "known_hosts"
    known.write_text("".join(line + "\n" for line in (sshdir / "known_hosts").read_text().splitlines()
                             if not line.split(" ", 1)[0].split(",")[0].strip("[]").startswith(addr1)))
    d = preset_dict(cluster, sshdir)
    d["cluster"]["ssh_config"] = _config_with(sshdir, tmp_path, node2=["ProxyJump node1"])
    d["cluster"]["known_hosts"] = str(known)
    preset = Preset.model_validate(d)
    with pytest.raises(UnknownHostKey) as e:
        transport_for(preset.cluster.nodes[2], preset)
    assert "node2 via jump host node1" in str(e.value)


def test_a_jump_host_that_cannot_reach_the_node_is_named_and_leaves_no_connection(cluster, sshdir, keyed,
                                                                                  tmp_path):
    d = preset_dict(cluster, sshdir)
    # node0's sshd is reached through node1, but on a port where nothing listens
    d["cluster"]["ssh_config"] = _config_with(sshdir, tmp_path, node0=["ProxyJump node1"])
    d["cluster"]["nodes"][0]["port"] = 2
    preset = Preset.model_validate(d)
    t = SSHTransport(resolve_target(preset.cluster.nodes[0], preset, _ssh_config(preset)))
    with pytest.raises(Unreachable, match=f"jump host root@{cluster.nodes[1].addr}:22 cannot open a connection to "
                                          f"{cluster.nodes[0].addr}:2"):
        t.connect()
    assert t._jump is None
