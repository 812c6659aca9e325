"""The probe reads a node's InfiniBand/RoCE HCAs over SSH: node1 gets a sysfs class tree with two HCAs
(bind-mounted over /sys/class in its own mount namespace only), and `check` finds their ports, state,
link layer and RoCE GID index there and nowhere else; the plan for a GPU run tells NCCL about them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qwen_tui.nodes.checks.runner import run_checks
from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.schema import Preset
from support.cluster import preset_dict
from support.netns import node_mount_ns_pid, sh

ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


def _port(root: Path, hca: str, *, state: str, layer: str, gids: dict) -> None:
    d = root / hca / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (d / sub).mkdir(parents=True)
    (d / "state").write_text(state + "\n")
    (d / "link_layer").write_text(layer + "\n")
    (d / "rate").write_text("200 Gb/sec (4X HDR)\n")
    for i in range(4):
        gid, typ = gids.get(i, (ZERO, None))
        (d / "gids" / str(i)).write_text(gid + "\n")
        if typ:
            (d / "gid_attrs" / "types" / str(i)).write_text(typ + "\n")
            (d / "gid_attrs" / "ndevs" / str(i)).write_text("eth0\n")


@pytest.fixture
def hcas_on_node1(cluster, tmp_path):
    cls = tmp_path / "sysclass"
    ib = cls / "infiniband"
    _port(ib, "mlx5_0", state="4: ACTIVE", layer="InfiniBand",
          gids={0: ("fe80:0000:0000:0000:b83f:d203:00a1:2b3c", "IB/RoCE v1")})
    _port(ib, "mlx5_1", state="4: ACTIVE", layer="Ethernet",
          gids={0: ("fe80:0000:0000:0000:a288:c2ff:fe30:9a0d", "IB/RoCE v1"),
                1: ("fe80:0000:0000:0000:a288:c2ff:fe30:9a0d", "RoCE v2"),
                2: ("0000:0000:0000:0000:0000:ffff:0a28:010b", "IB/RoCE v1"),
                3: ("0000:0000:0000:0000:0000:ffff:0a28:010b", "RoCE v2")})
    os.chmod(tmp_path, 0o755)
    sh("nsenter", "-t", str(node_mount_ns_pid(cluster, 1)), "-m", "mount", "--bind", str(cls), "/sys/class")
    try:
        assert not os.path.exists("/sys/class/infiniband")  # this machine's sysfs is untouched
        yield
    finally:
        sh("nsenter", "-t", str(node_mount_ns_pid(cluster, 1)), "-m", "umount", "/sys/class")


def test_the_probe_finds_a_nodes_hca_ports_and_the_plan_tells_nccl(cluster, sshdir, keyed, hcas_on_node1):
    preset = Preset.model_validate(preset_dict(cluster, sshdir))
    conns = connect_all(preset)
    try:
        assert conns.ok, conns.errors_text()
        rep = run_checks(preset, dict(conns), network=False)
    finally:
        close_all(conns)
    f1 = rep.facts.nodes[1]
    assert f1.ib_devices == ["mlx5_0", "mlx5_1"]
    assert [(p.hca, p.port, p.state, p.link_layer, p.gid_index, p.gid_type) for p in f1.ib_ports] == \
        [("mlx5_0", 1, "ACTIVE", "InfiniBand", None, None), ("mlx5_1", 1, "ACTIVE", "Ethernet", 3, "RoCE v2")]
    assert rep.facts.nodes[0].ib_ports == [] and rep.facts.nodes[2].ib_ports == []
    ib = [(f.node, f.code, f.level) for f in rep.findings if f.code.startswith("IB_")]
    assert ib == [(1, "IB_PORTS", "info")]

    d = preset_dict(cluster, sshdir, device="cuda", precision="bf16")
    d["network"]["backend"] = "nccl"  # the plan of a GPU run on these facts (nothing is launched)
    gpu = Preset.model_validate(d)
    envs = [c.env for c in make_plan(gpu, run_id="r", local_run_dir="/r", facts=rep.facts).nodes]
    assert envs[1]["NCCL_IB_DISABLE"] == "0"
    assert (envs[1]["NCCL_IB_HCA"], envs[1]["NCCL_IB_GID_INDEX"]) == ("=mlx5_0:1,mlx5_1:1", "3")
    assert all(e["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in e for e in (envs[0], envs[2]))
