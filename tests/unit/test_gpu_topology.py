"""The GPU topology parser, its judgements and the advice on them, on real `nvidia-smi topo` output from
several machine types (tests/fixtures/nvidia-smi/topo, sources in its README)."""

import json
from pathlib import Path

import pytest

from qwen_tui.advice.rules import advise, apply_fix
from qwen_tui.cluster.facts import GPU, ClusterFacts, NodeFacts
from qwen_tui.nodes.checks.probe import facts_from_json
from qwen_tui.nodes.checks.runner import CheckReport, consistency
from qwen_tui.nodes.checks.topology import (
    TopologyError,
    describe,
    intra_node_bus,
    node_intra_bus,
    p2p_risk,
    parse_p2p_matrix,
    parse_topo_matrix,
    with_p2p,
)
from qwen_tui.preset.schema import Preset

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi" / "topo"
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
RTX4090, RTX5090 = "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 5090"
PRO6000, A6000, L4 = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "NVIDIA RTX A6000", "NVIDIA L4"

# file -> (GPU name of that machine, GPUs, the one-line description, the bus kind)
MATRICES = {
    "h100-8x-nvswitch.txt": (H100, 8, "8 GPUs, NVSwitch (NV18), 2 NUMA nodes", "nvswitch"),
    "a100-8x-nvswitch.txt": (A100, 8, "8 GPUs, NVSwitch (NV12), 2 NUMA nodes", "nvswitch"),
    "h100-4x-nv6.txt": (H100, 4, "4 GPUs, NVLink mesh (NV6), 4 NUMA nodes", "nvlink"),
    "a100-2x-nv12-nics.txt": (A100, 2, "2 GPUs, NVLink (NV12)", "nvlink"),
    "pair-nv2.txt": ("", 2, "2 GPUs, NVLink (NV2)", "nvlink"),
    "a6000-3x-nv4-pair.txt": (A6000, 3, "3 GPUs, NVLink between 1 of 3 pairs (NV4), the rest PCIe (NODE)", "pcie"),
    "pair-phb.txt": ("", 2, "2 GPUs, PCIe (PHB)", "pcie"),
    "l4-2x-sys.txt": (L4, 2, "2 GPUs, PCIe (SYS), 2 NUMA nodes", "pcie"),
    "rtx4090-8x-sys.txt": (RTX4090, 8, "8 GPUs, PCIe (SYS), 2 NUMA nodes", "pcie"),
    "rtx4090-5x-numa.txt": (RTX4090, 5, "5 GPUs, PCIe (SYS), 2 NUMA nodes", "pcie"),
    "mixed-4x-phb.txt": (RTX4090, 4, "4 GPUs, PCIe (PHB)", "pcie"),
    "rtx5090-2x-phb.txt": (RTX5090, 2, "2 GPUs, PCIe (PHB)", "pcie"),
    "rtx-pro-6000-2x-phb.txt": (PRO6000, 2, "2 GPUs, PCIe (PHB)", "pcie"),
    "tesla-p4-1x.txt": ("Tesla P4", 1, "1 GPU", None),
}


def topo(name):
    return parse_topo_matrix((FIX / name).read_text())


def test_every_matrix_fixture_is_covered():
    on_disk = {p.name for p in FIX.glob("*.txt") if "-p2p-" not in p.name}
    assert on_disk == set(MATRICES)


@pytest.mark.parametrize("name", sorted(MATRICES))
def test_matrix_parses_into_pairs_and_affinities(name):
    gpu, n, text, kind = MATRICES[name]
    t = topo(name)
    assert t.gpus == n
    assert len(t.links) == n * (n - 1) // 2 and all(lk.a < lk.b < n for lk in t.links)
    assert len(t.cpu_affinity) == len(t.numa_affinity) == n
    assert describe(t, gpu) == text
    bus = intra_node_bus(t, gpu)
    assert (bus.kind if bus else None) == kind
    # the matrix is symmetric: the cell read from row a equals the one in row b of the same file
    rows = {r.split()[0]: r.split()[1:1 + n] for r in (FIX / name).read_text().splitlines()
            if r.split() and r.split()[0].startswith("GPU") and r.split()[0][3:].isdigit()}
    for lk in t.links:
        assert rows[f"GPU{lk.b}"][lk.a] == lk.link


def test_affinities_nics_and_empty_columns():
    t = topo("rtx4090-8x-sys.txt")  # two NIC rows and columns: not GPUs
    assert t.cpu_affinity[0] == "0-55,112-167" and t.cpu_affinity[7] == "56-111,168-223"
    assert t.numa_affinity[:4] == ["0"] * 4 and t.numa_affinity[4:] == ["1"] * 4
    assert {lk.link for lk in t.links} == {"SYS"}
    nics = topo("a100-2x-nv12-nics.txt")  # collect_env printed the affinity columns empty
    assert nics.cpu_affinity == [None, None] and nics.numa_affinity == [None, None]
    assert nics.link(1, 0).link == "NV12" and nics.link(0, 1).nvlinks == 12
    p4 = topo("tesla-p4-1x.txt")  # NUMA affinity N/A
    assert p4.links == [] and p4.cpu_affinity == ["0-7"] and p4.numa_affinity == [None]
    a6 = topo("a6000-3x-nv4-pair.txt")
    assert [(lk.a, lk.b, lk.link) for lk in a6.links] == [(0, 1, "NV4"), (0, 2, "NODE"), (1, 2, "NODE")]


def test_p2p_matrices_and_their_status_on_the_pairs():
    ok = parse_p2p_matrix((FIX / "h100-8x-p2p-r.txt").read_text())
    assert len(ok) == 56 and set(ok.values()) == {"OK"}
    h = with_p2p(topo("h100-8x-nvswitch.txt"), read=ok)
    assert all(lk.p2p_ok is True and lk.p2p_write is None for lk in h.links)
    assert describe(h, H100) == "8 GPUs, NVSwitch (NV18), 2 NUMA nodes"  # P2P is said only of PCIe pairs
    cns = parse_p2p_matrix((FIX / "l4-2x-p2p-r.txt").read_text())
    assert cns == {(0, 1): "CNS", (1, 0): "CNS"}
    l4 = with_p2p(topo("l4-2x-sys.txt"), read=cns)
    assert l4.links[0].p2p_ok is False and describe(l4, L4) == "2 GPUs, PCIe (SYS), no P2P (CNS), 2 NUMA nodes"
    gns = parse_p2p_matrix((FIX / "rtx5090-2x-p2p-gns.txt").read_text())  # tab-separated, trailing tabs
    assert gns == {(0, 1): "GNS", (1, 0): "GNS"}
    good = with_p2p(topo("rtx5090-2x-phb.txt"), read=parse_p2p_matrix((FIX / "rtx5090-2x-p2p-ok.txt").read_text()))
    assert describe(good, RTX5090) == "2 GPUs, PCIe (PHB), P2P OK"
    # one direction refused is no P2P for the pair
    half = with_p2p(topo("pair-phb.txt"), read={(0, 1): "OK", (1, 0): "NS"}, write={(0, 1): "OK", (1, 0): "OK"})
    assert half.links[0].p2p_read == "NS" and half.links[0].p2p_ok is False


def test_bus_figures_match_published_measurements():
    """NCCL all-reduce busbw measured on these machines (stas00/ml-engineering network/README.md): 8x A100
    234.89 GB/s, 8x H200 with NVLS off 367.61 GB/s. The class figure is within 5% of each."""
    a100 = intra_node_bus(topo("a100-8x-nvswitch.txt"), A100)
    assert a100.label == "NVSwitch, NVLink 3, 12 links" and abs(a100.gbs / 234.89 - 1) < 0.05
    h100 = intra_node_bus(topo("h100-8x-nvswitch.txt"), H100)
    assert h100.label == "NVSwitch, NVLink 4, 18 links" and abs(h100.gbs / 367.61 - 1) < 0.05
    # a direct 4-GPU mesh: 3 peers x NV6 = all 18 of an H100's links, not a switch
    assert intra_node_bus(topo("h100-4x-nv6.txt"), H100).label == "NVLink, NVLink 4, 18 links"
    # the A6000 bridge: 4 links x 14.0625 GB/s (nvidia-smi nvlink -s on that machine prints 14.062 per link)
    pair = intra_node_bus(topo("a6000-3x-nv4-pair.txt"), A6000, gpus=2)
    assert pair.kind == "nvlink" and pair.gbs == pytest.approx(4 * 14.0625 * 0.8, abs=0.1)
    # all three: the ring crosses PCIe, and workstation cards go through host memory
    three = intra_node_bus(topo("a6000-3x-nv4-pair.txt"), A6000)
    assert three.kind == "pcie" and three.gbs < pair.gbs / 3
    # PCIe with P2P is faster than the same path without; Gen5 faster than Gen4
    l4 = topo("l4-2x-sys.txt")
    with_ok = intra_node_bus(l4, L4).gbs
    without = intra_node_bus(with_p2p(l4, read={(0, 1): "CNS", (1, 0): "CNS"}), L4).gbs
    assert without == pytest.approx(with_ok / 2)
    gen5, gen4 = intra_node_bus(topo("rtx5090-2x-phb.txt"), RTX5090), intra_node_bus(topo("mixed-4x-phb.txt"), RTX4090)
    assert gen5.gbs > gen4.gbs
    # the node view, and a single GPU (no traffic inside the node)
    nf = NodeFacts(gpus=[GPU(i, H100, 81559) for i in range(8)], topology=topo("h100-8x-nvswitch.txt"))
    assert node_intra_bus(nf) == h100 and node_intra_bus(nf, gpus=1) is None
    assert node_intra_bus(NodeFacts(gpus=[])) is None and intra_node_bus(topo("tesla-p4-1x.txt"), "Tesla P4") is None


def test_p2p_risk_by_card_and_driver():
    assert p2p_risk(topo("h100-8x-nvswitch.txt"), H100) is None
    assert p2p_risk(topo("pair-phb.txt"), "") is None  # a datacenter-style PCIe pair, P2P not reported
    r = p2p_risk(topo("rtx4090-8x-sys.txt"), RTX4090)
    assert r.consumer and len(r.pairs) == 28 and r.where().endswith("and 25 more")
    # the RTX PRO 6000 report: the driver said OK, NCCL hung all the same
    ok = with_p2p(topo("rtx-pro-6000-2x-phb.txt"), read={(0, 1): "OK", (1, 0): "OK"})
    assert p2p_risk(ok, PRO6000).consumer
    # the bridged A6000 pair alone is safe; the third card brings PCIe pairs in
    assert p2p_risk(topo("a6000-3x-nv4-pair.txt"), A6000, gpus=2) is None
    assert [(lk.a, lk.b) for lk in p2p_risk(topo("a6000-3x-nv4-pair.txt"), A6000).pairs] == [(0, 2), (1, 2)]
    # a datacenter card the driver refuses P2P: a note, not a hang
    l4 = with_p2p(topo("l4-2x-sys.txt"), read=parse_p2p_matrix((FIX / "l4-2x-p2p-r.txt").read_text()))
    risk = p2p_risk(l4, L4)
    assert risk is not None and not risk.consumer and "P2P CNS" in risk.where()


@pytest.mark.parametrize("text, where", [
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "no header row"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tFOO\t0-7\nGPU1\tFOO\t X \t0-7\n", "row GPU0, column GPU1: 'FOO'"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-7\n", "no row for GPU1"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\tPHB\t X \t0-7\nGPU1\t X \tPHB\t0-7\n", "row GPU0: its own cell is 'PHB'"),
    ("\tGPU0\tGPU2\tCPU Affinity\nGPU0\t X \tPHB\t0-7\n", "not GPU0..GPU1"),
])
def test_bad_matrix_is_refused_saying_where(text, where):
    with pytest.raises(TopologyError) as e:
        parse_topo_matrix(text)
    assert where in str(e.value)


def test_colour_codes_and_older_soc_name_are_read():
    text = (FIX / "rtx5090-2x-phb.txt").read_text()
    t = parse_topo_matrix("\x1b[4m" + text.replace("CPU Affinity", "CPU Affinity\x1b[0m", 1))
    assert t.gpus == 2 and t.links[0].link == "PHB"
    assert parse_topo_matrix(text.replace("PHB", "SOC")).links[0].link == "SYS"


def test_topology_round_trips_through_facts_json():
    t = with_p2p(topo("rtx4090-5x-numa.txt"), read={(0, 1): "GNS", (1, 0): "GNS"})
    cf = ClusterFacts(nodes={0: NodeFacts(hostname="a", gpus=[GPU(0, RTX4090, 24564)], topology=t),
                             1: NodeFacts(hostname="b", topology_error="nvidia-smi topo -m failed (rc 9): x")})
    back = ClusterFacts.from_dict(json.loads(json.dumps(cf.to_dict())))
    assert back.nodes[0].topology == t and back.nodes[0].topology.link(0, 1).p2p_ok is False
    assert back.nodes[1].topology is None and back.nodes[1].topology_error.startswith("nvidia-smi topo")
    # facts written before the topology existed still load
    old = cf.to_dict()
    for n in old["nodes"].values():
        del n["topology"], n["topology_error"]
    assert ClusterFacts.from_dict(old).nodes[0].topology is None


def test_probe_answers_into_facts_absent_failed_and_garbled():
    base = {"hostname": "n", "tools": {"nvidia-smi": "/usr/bin/nvidia-smi"}, "versions": {},
            "nvidia_smi": {"rc": 0, "out": "index, name, uuid, memory.total [MiB], driver_version\n"
                           "0, NVIDIA L4, GPU-1, 23034 MiB, 550.54\n1, NVIDIA L4, GPU-2, 23034 MiB, 550.54\n", "err": ""}}
    none = facts_from_json({"hostname": "cpu", "tools": {"nvidia-smi": None}, "versions": {}})
    assert none.topology is None and none.topology_error is None  # no nvidia-smi: nothing, and no error
    older = facts_from_json(base)  # a probe from before the topology: nothing either
    assert older.topology is None and older.topology_error is None
    ok = facts_from_json({**base, "topo": {"rc": 0, "out": (FIX / "l4-2x-sys.txt").read_text(), "err": ""},
                          "p2p": {"r": {"rc": 0, "out": (FIX / "l4-2x-p2p-r.txt").read_text(), "err": ""},
                                  "w": {"rc": 0, "out": "garbage", "err": ""}}})
    assert ok.topology.links[0].p2p_read == "CNS" and ok.topology.links[0].p2p_write is None
    bad = facts_from_json({**base, "topo": {"rc": 0, "out": "GPU0 nonsense", "err": ""}})
    assert bad.topology is None and "nvidia-smi topo -m:" in bad.topology_error and bad.error is None


# ---------------------------------------------------------------- advice and the check matrix

def preset(gpus=8, nodes=2, **net):
    return Preset.model_validate({
        "cluster": {"nodes": [{"host": f"gpu{i}", "gpus": gpus} for i in range(nodes)], "shared_storage": True},
        "network": net, "training": {"model": "Qwen/Qwen2.5-7B-Instruct", "data": "/data/chat.jsonl"}})


def node(name, fixture, n=None, **p2p):
    t = with_p2p(topo(fixture), **p2p)
    return NodeFacts(hostname=fixture, gpus=[GPU(i, name, 24564) for i in range(n or t.gpus)], topology=t)


def p2p_advice(p, f):
    return [a for a in advise(p, f) if a.code.startswith("P2P")]


def test_consumer_pcie_node_gets_a_warning_whose_fix_sets_nccl_p2p_level():
    f = ClusterFacts(nodes={0: node(H100, "h100-8x-nvswitch.txt"), 1: node(RTX4090, "rtx4090-8x-sys.txt")})
    p = preset()
    adv = p2p_advice(p, f)
    assert [(a.code, a.level, a.node) for a in adv] == [("P2P_PCIE", "warning", 1)]
    assert "GeForce RTX 4090" in adv[0].message and "DeepSpeed#4433" in adv[0].message
    fixed = apply_fix(p, adv[0].fix)
    assert fixed.network.env == {"NCCL_P2P_LEVEL": "NVL"} and p.network.env == {}
    assert p2p_advice(fixed, f) == []
    # the user's own env is kept by the fix, and an env that already chose is left alone
    mine = preset(env={"NCCL_DEBUG": "INFO"})
    assert apply_fix(mine, p2p_advice(mine, f)[0].fix).network.env == {"NCCL_DEBUG": "INFO", "NCCL_P2P_LEVEL": "NVL"}
    assert p2p_advice(preset(env={"NCCL_P2P_DISABLE": "1"}), f) == []


@pytest.mark.parametrize("name, fixture, gpus, p2p, want", [
    (RTX5090, "rtx5090-2x-phb.txt", 2, "rtx5090-2x-p2p-gns.txt", "warning"),
    (RTX5090, "rtx5090-2x-phb.txt", 2, "rtx5090-2x-p2p-ok.txt", "warning"),  # a patched driver's OK: still PCIe
    (PRO6000, "rtx-pro-6000-2x-phb.txt", 2, None, "warning"),
    (RTX4090, "mixed-4x-phb.txt", 4, None, "warning"),
    (RTX4090, "rtx4090-5x-numa.txt", 1, None, None),  # one rank on the node: no intra-node collective
    (A6000, "a6000-3x-nv4-pair.txt", 2, None, None),  # the bridged pair only
    (A6000, "a6000-3x-nv4-pair.txt", 3, None, "warning"),
    (L4, "l4-2x-sys.txt", 2, "l4-2x-p2p-r.txt", "info"),
    (L4, "l4-2x-sys.txt", 2, None, None),
    (H100, "h100-4x-nv6.txt", 4, None, None),
    (A100, "a100-8x-nvswitch.txt", 8, None, None),
    ("Tesla P4", "tesla-p4-1x.txt", 1, None, None),
])
def test_p2p_advice_on_every_machine(name, fixture, gpus, p2p, want):
    read = parse_p2p_matrix((FIX / p2p).read_text()) if p2p else None
    f = ClusterFacts(nodes={0: node(name, fixture, read=read)})
    adv = p2p_advice(preset(gpus=gpus, nodes=1), f)
    assert [a.level for a in adv] == ([want] if want else [])
    if want == "warning":
        assert adv[0].fix.changes == {"network.env": {"NCCL_P2P_LEVEL": "NVL"}}
    if want == "info":
        assert adv[0].code == "P2P_UNSUPPORTED" and adv[0].fix is None and "CNS" in adv[0].message


def test_no_p2p_advice_for_cpu_or_gloo_runs():
    f = ClusterFacts(nodes={0: node(RTX4090, "rtx4090-8x-sys.txt")})
    cpu = Preset.model_validate({**preset(nodes=1).model_dump(exclude_unset=True),
                                 "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "device": "cpu"}})
    assert p2p_advice(cpu, f) == [] and p2p_advice(preset(nodes=1, backend="gloo"), f) == []


def test_check_matrix_shows_the_topology_and_marks_the_gpu_cell():
    f = ClusterFacts(nodes={0: node(H100, "h100-8x-nvswitch.txt", read=parse_p2p_matrix(
        (FIX / "h100-8x-p2p-r.txt").read_text())), 1: node(RTX4090, "rtx4090-8x-sys.txt")})
    for nf in f.nodes.values():
        nf.versions, nf.training_importable = {"torch": "2.13.0"}, True
    p = preset()
    rep = CheckReport(f, consistency(p, f), labels=["gpu0", "gpu1"])
    topo_lines = {x.node: x.message for x in rep.findings if x.code == "GPU_TOPOLOGY"}
    assert topo_lines[0] == "gpu0: 8 GPUs, NVSwitch (NV18), 2 NUMA nodes; bus ~360 GB/s (NVSwitch, NVLink 4, 18 links)"
    assert topo_lines[1].startswith("gpu1: 8 GPUs, PCIe (SYS), 2 NUMA nodes; bus ~12.4 GB/s")
    warn = [x for x in rep.findings if x.code == "P2P_PCIE"]
    assert [(x.node, x.check, x.level) for x in warn] == [(1, "gpu", "warning")] and "NCCL_P2P_LEVEL" in warn[0].fix
    rep._checked = {0: {"gpu"}, 1: {"gpu"}}
    assert rep.verdict(0, "gpu") == "ok" and rep.verdict(1, "gpu") == "warning"
    unread = NodeFacts(gpus=[GPU(0, H100, 81559)], topology_error="nvidia-smi topo -m: no header row starting with GPU0",
                       versions={"torch": "2.13.0"}, training_importable=True)
    msgs = [x.message for x in consistency(preset(nodes=1, gpus=1), ClusterFacts(nodes={0: unread}))
            if x.code == "GPU_TOPOLOGY"]
    assert msgs == ["gpu0: GPU topology not read (nvidia-smi topo -m: no header row starting with GPU0)"]


def test_codes_are_documented():
    from qwen_tui.advice.codes import ADVICE
    from qwen_tui.nodes.checks.codes import CHECKS

    docs = Path(__file__).resolve().parents[2] / "docs"
    for code in ("P2P_PCIE", "P2P_UNSUPPORTED"):  # the reference is generated from these tables
        assert code in ADVICE and code in CHECKS
    assert "GPU_TOPOLOGY" in CHECKS and "`GPU_TOPOLOGY`" in (docs / "guides" / "checks.md").read_text()
    assert "intra_node_bus" in (docs / "guides" / "estimates.md").read_text()


def test_the_estimator_takes_the_slowest_nodes_probed_bus_inside_a_node():
    from qwen_tui.advice.core import make_context
    from qwen_tui.cluster.facts import ClusterFacts
    from qwen_tui.preset.schema import Preset

    preset = Preset.model_validate({
        "cluster": {"nodes": [{"host": "a", "gpus": 8}, {"host": "b", "gpus": 8}]},
        "training": {"model": "Qwen/Qwen2.5-7B-Instruct", "data": "d.jsonl", "zero_stage": 3}})
    gpus = [GPU(i, H100, 81559) for i in range(8)]
    nvswitch = NodeFacts(gpus=gpus, topology=topo("h100-8x-nvswitch.txt"))
    pcie = NodeFacts(gpus=gpus, topology=topo("rtx4090-8x-sys.txt"))
    both = make_context(preset, ClusterFacts(nodes={0: nvswitch, 1: nvswitch}))
    assert both.intra_node_gbs == node_intra_bus(nvswitch, 8).gbs > 300
    slow = make_context(preset, ClusterFacts(nodes={0: nvswitch, 1: pcie}))
    assert slow.intra_node_gbs == node_intra_bus(pcie, 8).gbs < 64  # the PCIe node sets the pace
    assert make_context(preset, ClusterFacts(nodes={0: NodeFacts(gpus=gpus)})).intra_node_gbs is None  # the table's
    assert make_context(preset, ClusterFacts(nodes={0: pcie}), intra_node_gbs=100.0).intra_node_gbs == 100.0
