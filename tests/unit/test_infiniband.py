"""InfiniBand/RoCE: detection on fake sysfs trees (the code the probe ships to the nodes), ibv_devinfo,
the NCCL variables the plan sets, and NCCL's own account of the network it chose (real log formats,
tests/fixtures/nccl/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen_tui.cluster.facts import GPU, ClusterFacts, IBPort, NodeFacts
from qwen_tui.cluster.ib import nccl_ib_env, nccl_transport, parse_ibv_devinfo, ports_from_probe
from qwen_tui.nodes.checks.ibcheck import ib_findings, nccl_network_findings
from qwen_tui.nodes.checks.probe import facts_from_json
from qwen_tui.nodes.checks.rehearsal import _tail, rehearsal_env
from qwen_tui.nodes.programs import program
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.schema import Preset

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def _shipped_reader():
    """read_sysfs as the node's python defines it: the program's own text, nothing from qwen_tui."""
    ns: dict = {}
    exec(compile(program("ib_sysfs.py"), "ib_sysfs.py", "exec"), ns)
    return ns["read_sysfs"]


read_sysfs = _shipped_reader()
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


def _port(root: Path, hca: str, port: int, *, state: str, layer: str, rate: str = "100 Gb/sec (4X EDR)",
          gids: dict | None = None, table: int = 8, netdevs: tuple = ()) -> None:
    """One port as the kernel lays it out: every GID slot a file (zeros when empty); the type and
    ndev attributes exist only for populated slots (reading the others fails with EINVAL)."""
    d = root / hca / "ports" / str(port)
    (d / "gids").mkdir(parents=True)
    (d / "gid_attrs" / "types").mkdir(parents=True)
    (d / "gid_attrs" / "ndevs").mkdir(parents=True)
    (d / "state").write_text(state + "\n")
    (d / "phys_state").write_text("5: LinkUp\n" if "ACTIVE" in state else "3: Disabled\n")
    (d / "link_layer").write_text(layer + "\n")
    (d / "rate").write_text(rate + "\n")
    for i in range(table):
        gid, typ, ndev = (gids or {}).get(i, (ZERO, None, None))
        (d / "gids" / str(i)).write_text(gid + "\n")
        if typ:
            (d / "gid_attrs" / "types" / str(i)).write_text(typ + "\n")
            (d / "gid_attrs" / "ndevs" / str(i)).write_text(ndev + "\n")
    for n in netdevs:
        (root / hca / "device" / "net" / n).mkdir(parents=True, exist_ok=True)


ROCE_GIDS = {
    0: ("fe80:0000:0000:0000:a288:c2ff:fe30:9a0d", "IB/RoCE v1", "ens1f0np0"),
    1: ("fe80:0000:0000:0000:a288:c2ff:fe30:9a0d", "RoCE v2", "ens1f0np0"),
    2: ("0000:0000:0000:0000:0000:ffff:0a28:010b", "IB/RoCE v1", "ens1f0np0"),
    3: ("0000:0000:0000:0000:0000:ffff:0a28:010b", "RoCE v2", "ens1f0np0"),
}


@pytest.fixture
def sysfs(tmp_path) -> Path:
    root = tmp_path / "infiniband"
    _port(root, "mlx5_0", 1, state="4: ACTIVE", layer="InfiniBand", rate="400 Gb/sec (4X NDR)",
          gids={0: ("fe80:0000:0000:0000:b83f:d203:00a1:2b3c", "IB/RoCE v1", "")}, netdevs=("ibp26s0",))
    _port(root, "mlx5_1", 1, state="4: ACTIVE", layer="Ethernet", gids=ROCE_GIDS, netdevs=("ens1f0np0",))
    _port(root, "mlx5_10", 1, state="1: DOWN", layer="Ethernet", gids={1: ROCE_GIDS[1]})
    return root


def test_sysfs_ports_states_link_layers_and_the_roce_gid_index(sysfs):
    raw = read_sysfs(str(sysfs))
    assert [(p["hca"], p["port"]) for p in raw] == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_10", 1)]
    assert len(raw[1]["gids"]) == 4  # the empty slots are left out
    ports = ports_from_probe(raw)
    ib, roce, down = ports
    assert (ib.state, ib.link_layer, ib.gid_index, ib.rate) == ("ACTIVE", "InfiniBand", None, "400 Gb/sec (4X NDR)")
    # RoCE v2 with the IPv4-mapped address, not index 0 (RoCE v1 link-local)
    assert (roce.state, roce.link_layer, roce.gid_index, roce.gid_type, roce.netdev) == \
        ("ACTIVE", "Ethernet", 3, "RoCE v2", "ens1f0np0")
    assert down.state == "DOWN" and down.gid_index == 1  # only an IPv6 RoCE v2 GID: the next best
    env = nccl_ib_env(ports)
    # exact names (=): a bare mlx5_1 would also select mlx5_10; the down port is left out
    assert env == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": "3"}


def test_no_sysfs_tree_or_a_half_populated_one(tmp_path, sysfs):
    assert read_sysfs(str(tmp_path / "absent")) == []
    (sysfs / "mlx5_9" / "ports").mkdir(parents=True)  # an HCA with no ports listed yet
    (sysfs / "mlx5_1" / "ports" / "1" / "rate").unlink()
    raw = read_sysfs(str(sysfs))
    assert [p["hca"] for p in raw] == ["mlx5_0", "mlx5_1", "mlx5_10"] and raw[1]["rate"] is None
    assert nccl_ib_env(ports_from_probe([])) == {}
    only_down = ports_from_probe([p for p in raw if p["hca"] == "mlx5_10"])
    assert nccl_ib_env(only_down) == {}


def test_the_probe_ships_the_same_reader():
    probe = program("probe.py")
    assert probe.startswith(program("ib_sysfs.py")) and 'read_sysfs(ib)' in probe


def test_ibv_devinfo_fills_in_where_sysfs_shows_nothing():
    text = (FIX / "ibv_devinfo_v.txt").read_text()
    raw = parse_ibv_devinfo(text)
    assert [(p["hca"], p["port"], p["link_layer"]) for p in raw] == \
        [("mlx5_0", 1, "InfiniBand"), ("mlx5_1", 1, "Ethernet"), ("mlx5_1", 2, "Ethernet")]
    ports = ports_from_probe(raw)
    assert [p.state for p in ports] == ["ACTIVE", "ACTIVE", "DOWN"]
    assert ports[1].gid_index == 3 and ports[1].gid_type == "RoCE v2"
    f = facts_from_json({"ib_devices": [], "ib_ports": [], "ibv_devinfo": {"rc": 0, "out": text, "err": ""}})
    assert f.ib_devices == ["mlx5_0", "mlx5_1"] and nccl_ib_env(f.ib_ports)["NCCL_IB_GID_INDEX"] == "3"
    # sysfs wins where it has ports; a failed ibv_devinfo adds nothing
    assert facts_from_json({"ib_ports": [], "ibv_devinfo": {"rc": 1, "out": "", "err": "x"}}).ib_ports == []


def _preset(**network):
    return Preset.model_validate({
        "cluster": {"nodes": [{"host": "10.0.0.1", "gpus": 1}, {"host": "10.0.0.2", "gpus": 1},
                              {"host": "10.0.0.3", "gpus": 1}]},
        "network": {"master_addr": "10.0.0.1", **network},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "device": "cuda"}})


def _facts(sysfs):
    gpu = [GPU(0, "NVIDIA H200", 143771)]
    ports = ports_from_probe(read_sysfs(str(sysfs)))
    down = [IBPort("mlx5_0", 1, "DOWN", "InfiniBand")]
    return ClusterFacts(nodes={0: NodeFacts(gpus=gpu, ib_devices=["mlx5_0", "mlx5_1", "mlx5_10"], ib_ports=ports),
                               1: NodeFacts(gpus=gpu, ib_devices=["mlx5_0"], ib_ports=down),
                               2: NodeFacts(gpus=gpu)})


def test_the_plan_sets_the_hcas_and_gid_index_unless_the_preset_fixes_them(sysfs):
    facts = _facts(sysfs)
    envs = [c.env for c in make_plan(_preset(), run_id="r", local_run_dir="/r", facts=facts).nodes]
    assert envs[0]["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1" and envs[0]["NCCL_IB_GID_INDEX"] == "3"
    assert envs[0]["NCCL_IB_DISABLE"] == "0"
    assert envs[1]["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in envs[1]  # its only port is down
    assert envs[2]["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in envs[2]
    fixed = _preset(env={"NCCL_IB_HCA": "mlx5_1", "NCCL_IB_GID_INDEX": "1"})
    env0 = make_plan(fixed, run_id="r", local_run_dir="/r", facts=facts).nodes[0].env
    assert (env0["NCCL_IB_HCA"], env0["NCCL_IB_GID_INDEX"]) == ("mlx5_1", "1")
    off = make_plan(_preset(nccl_ib_disable=True), run_id="r", local_run_dir="/r", facts=facts).nodes[0].env
    assert off["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in off


def test_facts_with_ports_survive_a_round_trip(sysfs):
    facts = _facts(sysfs)
    back = ClusterFacts.from_dict(facts.to_dict())
    assert back.nodes[0].ib_ports == facts.nodes[0].ib_ports and back.nodes[2].ib_ports == []
    assert ClusterFacts.from_dict({"nodes": {"0": {"hostname": "old"}}}).nodes[0].ib_ports == []  # facts from before


@pytest.mark.parametrize("name, net", [("ib_roce_2_21.log", "IB"), ("socket_fallback.log", "Socket"),
                                       ("ib_2_4_old.log", "IB"), ("sharp_plugin.log", "IB"),
                                       ("single_node.log", None)])
def test_the_network_nccl_chose_from_its_info_lines(name, net):
    assert nccl_transport((FIX / name).read_text()) == net


def test_one_rank_on_sockets_is_a_fall_back_and_the_announcement_alone_counts_without_channels():
    ib = (FIX / "ib_roce_2_21.log").read_text()
    socket_channel = "gpu-a01:31209:31292 [2] NCCL INFO Channel 00/0 : 2[0] -> 3[1] [send] via NET/Socket/0\n"
    assert nccl_transport(ib + socket_channel) == "Socket"
    announced = [ln for ln in ib.splitlines() if "Channel" not in ln]
    assert nccl_transport("\n".join(announced)) == "IB"
    # torchrun's per-rank prefix in front of NCCL's own does not hide the line
    assert nccl_transport("[rank1]: " + socket_channel) == "Socket"


def test_a_socket_fall_back_on_a_node_with_hcas_is_a_warning_naming_it(sysfs):
    facts = _facts(sysfs)
    labels = ["gpu-a01", "gpu-a02", "gpu-a03"]
    logs = {0: (FIX / "socket_fallback.log").read_text(), 1: (FIX / "socket_fallback.log").read_text(),
            2: (FIX / "socket_fallback.log").read_text()}
    found = nccl_network_findings(labels, facts, {i: nccl_transport(t) for i, t in logs.items()})
    warn = [f for f in found if f.code == "NCCL_SOCKET_FALLBACK"]
    # node 0 has active HCAs; node 1's only port is down (its own warning says so); node 2 has none
    assert [(f.node, f.level) for f in warn] == [(0, "warning")]
    assert "gpu-a01" in warn[0].message and "mlx5_1:1 RoCE ACTIVE gid 3" in warn[0].message and warn[0].fix
    ok = nccl_network_findings(labels, facts, {0: nccl_transport((FIX / "ib_roce_2_21.log").read_text())})
    assert [(f.code, f.level) for f in ok] == [("NCCL_NETWORK", "info")] and "NET/IB" in ok[0].message
    down = ib_findings(1, "gpu-a02", facts.nodes[1])
    assert [(f.code, f.level) for f in down] == [("IB_PORTS_DOWN", "warning")] and "mlx5_0:1 IB DOWN" in down[0].message


def test_the_rehearsal_asks_nccl_for_its_info_lines_and_keeps_them_out_of_the_tail():
    env = rehearsal_env({"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "=mlx5_0:1", "NCCL_DEBUG_FILE": "/tmp/n.%h"}, "nccl")
    assert env["NCCL_DEBUG"] == "INFO" and "NET" in env["NCCL_DEBUG_SUBSYS"] and env["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert "NCCL_DEBUG_FILE" not in env  # the lines must reach the job's log, where they are read
    assert "NCCL_DEBUG" not in rehearsal_env({}, "gloo")
    log = (FIX / "socket_fallback.log").read_text() + "RuntimeError: NCCL error: remote process exited\n"
    assert _tail(log)[-1].startswith("RuntimeError") and not any(" NCCL INFO " in x for x in _tail(log))
