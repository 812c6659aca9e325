"""SSH transport, host keys and key setup against real sshd servers."""

from __future__ import annotations

import os
import signal
import stat
import time

import paramiko
import pytest

from qwen_tui.nodes.connect import connect_all, transport_for
from qwen_tui.nodes.keys import setup_keys
from qwen_tui.nodes.transport.hostkeys import ChangedHostKey, UnknownHostKey, fingerprint
from qwen_tui.nodes.transport.protocol import stop_group
from qwen_tui.preset.schema import Preset
from support.cluster import preset_dict


def test_key_setup_from_password_only_to_all_pairs(cluster, sshdir, keyed):
    # `keyed` ran the setup once, after proving that only a password worked
    assert keyed.key.created
    assert stat.S_IMODE(os.stat(keyed.key.private_path).st_mode) == 0o600
    assert keyed.installed.ok and set(keyed.installed.values()) == {1}
    assert keyed.ok, keyed.matrix
    n = len(cluster.nodes)
    assert len(keyed.matrix) == n * (n - 1) and all(v is None for v in keyed.matrix.values())
    snapshot = {p: p.read_bytes() for nd in cluster.nodes for p in (nd.home / ".ssh").iterdir()}

    # a second run changes nothing, anywhere
    preset = Preset.model_validate(preset_dict(cluster, sshdir))
    again = setup_keys(preset, "a wrong password: must not be needed")
    assert again.ok and not again.changed
    assert set(again.installed.values()) == {0} and set(again.mesh.values()) == {0}
    assert {p: p.read_bytes() for p in snapshot} == snapshot
    for nd in cluster.nodes:
        lines = (nd.home / ".ssh" / "authorized_keys").read_text().splitlines()
        assert len(lines) == len(set(lines)) == n + 1  # this machine's key + every node's


def test_connect_all_reuses_one_connection_per_node(preset, cluster):
    conns = connect_all(preset)
    try:
        assert conns.ok, conns.errors_text()
        hostnames = {i: t.run(["hostname"], timeout=10).stdout.strip() for i, t in conns.items()}
        assert hostnames == {i: f"node{i}" for i in range(len(cluster.nodes))}
        t = conns[1]
        before = t._client.get_transport()
        for _ in range(3):
            assert t.run(["true"], timeout=5).ok
        assert t._client.get_transport() is before
        r = t.run(["sh", "-c", 'echo "$1"; echo err >&2; exit 3', "sh", "a b"], timeout=5)
        assert (r.rc, r.stdout, r.stderr) == (3, "a b\n", "err\n")
        # 3 MB: more than paramiko's 2 MiB channel window each way, so input and
        # output must interleave; and the output must not be cut off at the exit status
        big = "".join(f"{i:07d} qwen\n" for i in range(300_000))
        r = t.run(["cat"], timeout=30, input=big.encode())
        assert r.ok and len(r.stdout) == len(big) and r.stdout == big
        for _ in range(5):
            assert t.run(["cat"], timeout=5, input=b"x" * 200000).stdout == "x" * 200000
    finally:
        for t in conns.values():
            t.close()


def test_command_timeout_is_enforced_on_the_node(preset, cluster):
    t = transport_for(preset.cluster.nodes[2], preset)
    try:
        t0 = time.monotonic()
        r = t.run(["sleep", "30"], timeout=2)
        assert r.rc in (124, 137) and time.monotonic() - t0 < 8
        time.sleep(1)
        assert not any(b"sleep" in open(f"/proc/{p}/cmdline", "rb").read() for p in cluster.job_pids(2))
    finally:
        t.close()


def test_detached_job_outlives_the_session_and_stops_by_group(preset, cluster, tmp_path):
    node = preset.cluster.nodes[1]
    t = transport_for(node, preset)
    log, rc = str(tmp_path / "j" / "log"), str(tmp_path / "j" / "rc")
    pid = t.start_job(["sh", "-c", "sleep 60 & sleep 60; exit 0"], env={"A": "1"}, cwd="/", log=log, rcfile=rc)
    t.close()  # the session ends; the job must not
    t = transport_for(node, preset)
    try:
        assert t.group_alive(pid)
        assert len(cluster.job_pids(1)) >= 3  # sh + two sleeps
        assert stop_group(t, pid, grace=5)
        assert not t.group_alive(pid)
        assert cluster.job_pids(1) == []
        assert t.signal_group(pid, signal.SIGTERM) is False
    finally:
        t.close()


def test_unknown_host_key_refused_without_consent_then_recorded(preset, cluster, tmp_path):
    kh = tmp_path / "known_hosts"
    p = preset.model_copy(deep=True)
    p.cluster.known_hosts = str(kh)
    with pytest.raises(UnknownHostKey) as e:
        transport_for(p.cluster.nodes[1], p)
    assert "node1" in str(e.value) and not kh.exists()
    res = connect_all(p)  # per node, never only the first
    assert set(res.failed) == {0, 1, 2} and all(isinstance(x, UnknownHostKey) for x in res.failed.values())

    t = transport_for(p.cluster.nodes[1], p, accept_new_host_keys=True)
    t.close()
    assert kh.read_text().strip() == cluster.host_key_line(1)
    transport_for(p.cluster.nodes[1], p).close()  # now known: no consent needed


def test_changed_host_key_refused_naming_node_and_both_fingerprints(preset, cluster, tmp_path):
    kh = tmp_path / "known_hosts"
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    other = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    real = cluster.host_key_line(2).split()
    kh.write_text(f"{real[0]} {other}\n")
    p = preset.model_copy(deep=True)
    p.cluster.known_hosts = str(kh)
    with pytest.raises(ChangedHostKey) as e:
        transport_for(p.cluster.nodes[2], p, accept_new_host_keys=True)  # consent does not cover a change
    msg = str(e.value)
    real_fp = fingerprint(paramiko.PKey.from_type_string(real[1], __import__("base64").b64decode(real[2])))
    wrong_fp = fingerprint(paramiko.PKey.from_type_string("ssh-ed25519",
                                                          __import__("base64").b64decode(other.split()[1])))
    assert "node2" in msg and real_fp in msg and wrong_fp in msg
    assert kh.read_text() == f"{real[0]} {other}\n"  # nothing rewritten
