"""Shared memory and limits per node: a 64 MB /dev/shm (Docker's default) on one node is
named with the fix; the limits a job started over SSH gets are measured on every node."""

from __future__ import annotations

import os

import pytest

from qwen_tui.nodes.checks.runner import run_checks
from qwen_tui.nodes.connect import close_all, connect_all
from support.netns import node_mount_ns_pid, sh


@pytest.fixture
def small_shm_on_node1(cluster):
    """A 64 MiB tmpfs on /dev/shm in node1's own mount namespace (private: the host's stays)."""
    host_before = os.statvfs("/dev/shm").f_blocks
    pid = node_mount_ns_pid(cluster, 1)
    sh("nsenter", "-t", str(pid), "-m", "mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", "/dev/shm")
    try:
        assert os.statvfs("/dev/shm").f_blocks == host_before  # nothing leaked to this machine
        yield
    finally:
        # any live process of the node's namespace: the one found first may have been a session that ended since
        sh("nsenter", "-t", str(node_mount_ns_pid(cluster, 1)), "-m", "umount", "/dev/shm")


def test_a_64mb_dev_shm_on_one_node_is_named_with_the_fix(preset, cluster, small_shm_on_node1):
    conns = connect_all(preset)
    try:
        assert conns.ok, conns.errors_text()
        rep = run_checks(preset, dict(conns), network=False)
    finally:
        close_all(conns)
    shm = [f for f in rep.findings if f.code == "SHM_SMALL"]
    assert [f.node for f in shm] == [1], [(f.code, f.message) for f in rep.findings]
    assert "node1" in shm[0].message and "64 MiB" in shm[0].message and "--shm-size" in shm[0].fix
    assert rep.facts.nodes[1].shm_bytes == 64 << 20
    assert rep.verdict(1, "limits") == "warning" and rep.verdict(0, "limits") in ("ok", "warning")
    for i in range(3):  # the limits were read on every node, as its login session has them
        f = rep.facts.nodes[i]
        assert f.open_files and f.memlock_bytes is not None, f
