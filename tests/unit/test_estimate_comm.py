"""The multi-node step model: where the bandwidth comes from, NCCL's latency, what overlap cannot hide, uneven
GPU counts, 4-bit bases under ZeRO-3, and "unknown" where nothing was measured."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from qwen_tui.cli.main import main
from qwen_tui.cluster.facts import GPU, ClusterFacts, IBPort, LinkFacts, NodeFacts
from qwen_tui.model.spec import resolve_model
from qwen_tui.plan.estimate import GPUS, RunShape
from qwen_tui.plan.estimate_comm import (
    NIC_EFFICIENCY,
    REHEARSAL_BUCKET_MB,
    latency_s,
    port_gbps,
    resolve_bandwidth,
    step_comm,
)
from qwen_tui.plan.estimate_time import estimate_step, nodes_worth_it, scaling
from support.paths import ROOT as REPO

SEVEN = resolve_model("Qwen/Qwen2.5-7B")
H100 = dict(gpu_tflops=GPUS["H100"].bf16_tflops, intra_node_gbs=GPUS["H100"].intra_node_gbs,
            hbm_gbs=GPUS["H100"].hbm_gbs)


def ib_node(i, ports=8, rate="400 Gb/sec (4X NDR)", state="ACTIVE"):
    return NodeFacts(hostname=f"gpu{i}", gpus=[GPU(j, "NVIDIA H100 80GB HBM3", 81559) for j in range(8)],
                     ib_ports=[IBPort(f"mlx5_{k}", 1, state, "InfiniBand", rate) for k in range(ports)])


# ---------------------------------------------------------------- the bandwidth and its source

def test_bandwidth_sources_in_order_of_trust():
    f = ClusterFacts(nodes={0: ib_node(0), 1: ib_node(1)}, links={1: LinkFacts(bandwidth_gbps=9.4)},
                     rehearsal_bandwidth_gbps=2900.0, rehearsal_size_mb=256)
    assert resolve_bandwidth(f, given_gbps=100).source == "given"
    bw = resolve_bandwidth(f, nic_gbps=200, nics=4)
    assert (bw.source, bw.gbps, bw.lower_bound) == ("rehearsal", 2900.0, False) and "at 256 MB" in bw.detail
    f.rehearsal_bandwidth_gbps = None
    bw = resolve_bandwidth(f, nic_gbps=200, nics=4)
    assert bw.source == "nics" and bw.gbps == pytest.approx(800 * NIC_EFFICIENCY)
    bw = resolve_bandwidth(f)
    assert bw.source == "ib-ports" and bw.gbps == pytest.approx(3200 * NIC_EFFICIENCY) and "8 active" in bw.detail
    # NCCL told to keep off InfiniBand: the probe's ports are not what it uses; iperf3 is all there is
    bw = resolve_bandwidth(f, ib_disabled=True)
    assert bw.source == "iperf3" and bw.gbps == 9.4 and bw.lower_bound and "lower bound" in bw.detail
    none = resolve_bandwidth(ClusterFacts(nodes={0: ib_node(0, ports=0), 1: ib_node(1, ports=0)}))
    assert none.source == "unknown" and none.gbps is None and not none.known and "qwen-tui check" in none.detail
    assert resolve_bandwidth(None).source == "unknown"


def test_ports_count_on_the_slowest_node_and_only_when_up():
    f = ClusterFacts(nodes={0: ib_node(0), 1: ib_node(1, ports=4, rate="200 Gb/sec (4X HDR)")})
    assert resolve_bandwidth(f).gbps == pytest.approx(800 * NIC_EFFICIENCY)
    down = ClusterFacts(nodes={0: ib_node(0), 1: ib_node(1, state="DOWN")})
    assert resolve_bandwidth(down).source == "unknown"
    assert port_gbps("400 Gb/sec (4X NDR)") == 400 and port_gbps("100 Gb/sec (2X HDR)") == 100
    assert port_gbps(None) is None and port_gbps("garbage") is None


def test_a_rehearsal_on_one_node_is_not_the_link_between_nodes():
    f = ClusterFacts(links={1: LinkFacts(bandwidth_gbps=9.4)}, rehearsal_bandwidth_gbps=2900.0,
                     rehearsal_size_mb=256, rehearsal_nodes=1)
    assert resolve_bandwidth(f).source == "iperf3"
    f.rehearsal_nodes = 2
    assert resolve_bandwidth(f).source == "rehearsal"
    assert ClusterFacts.from_dict(f.to_dict()).rehearsal_nodes == 2


def test_a_rehearsal_below_a_buckets_size_reads_as_a_lower_bound():
    f = ClusterFacts(rehearsal_bandwidth_gbps=40.0, rehearsal_size_mb=16)
    bw = resolve_bandwidth(f)
    assert bw.source == "rehearsal" and bw.lower_bound and f"{REHEARSAL_BUCKET_MB} MB" in bw.detail


# ---------------------------------------------------------------- NCCL's latency and the overlap

def test_ring_latency_grows_with_the_ranks_and_tree_caps_all_reduce():
    ag = [latency_s("allgather", 8 * n, n, "nvlink") for n in (1, 2, 16, 128)]
    assert ag == sorted(ag) and ag[-1] > 50 * ag[0]
    # about 4 us per added GPU at 8 per node: 7 NVLink hops of 3.4 us and one network hop of 9.6 us per node
    per_gpu = (latency_s("allgather", 1024, 128, "nvlink") - latency_s("allgather", 512, 64, "nvlink")) / 512
    assert per_gpu == pytest.approx((7 * 3.4 + 9.6) / 8 * 1e-6, rel=0.01)
    # all-reduce: NCCL picks the tree when the ring would be slower (many nodes)
    ring_ar = 2 * latency_s("allgather", 1024, 128, "nvlink") * 1.9
    assert latency_s("allreduce", 1024, 128, "nvlink") < ring_ar / 5
    assert latency_s("allreduce", 1, 1, "nvlink") == 0.0


def test_what_overlap_cannot_hide():
    kw = dict(world=16, nodes=2, bus_Bps=50e9, intra="nvlink", layers=28, param_bytes=2e9, layer_param_bytes=5e7,
              gathers_per_micro=2, fwd_window=10.0, bwd_window=20.0)
    # a small gradient (one bucket), a backward far longer than it: the last bucket still waits, every micro-batch
    z2 = step_comm("zero2", grad_accum=1, grad_bytes=3e8, **kw)
    rs = 15 / 16 * 3e8 / 50e9
    assert z2.exposed_s >= rs + 15 / 16 * 2e9 / 50e9  # the last (only) bucket and the weights' all-gather
    assert step_comm("zero2", grad_accum=4, grad_bytes=3e8, **kw).exposed_s > 3.5 * rs
    # ZeRO-3: the first layer's gather of each forward and the last reduce-scatter cannot hide
    z3 = step_comm("zero3", grad_accum=1, grad_bytes=2e9, **kw)
    assert z3.exposed_s >= 15 / 16 * 5e7 / 50e9 + z3.latency_s and z3.exposed_s < z3.total_s
    # what hides still costs the compute beside it a share of the GPU
    assert 0 < z3.interference_s < z3.total_s - z3.exposed_s
    # ZeRO-1 reduces once a step (whole gradients until the boundary), ZeRO-2 every micro-batch
    z1 = step_comm("zero1", grad_accum=4, grad_bytes=3e8, **kw)
    assert z1.bytes_per_gpu == pytest.approx(15 / 16 * (3e8 + 2e9))
    assert z1.exposed_s < step_comm("zero2", grad_accum=4, grad_bytes=3e8, **kw).exposed_s
    ddp = step_comm("ddp", grad_accum=1, grad_bytes=3e8, **kw)
    assert ddp.exposed_s >= 2 * 15 / 16 * 25 * 2**20 / 50e9  # DDP's last 25 MB bucket
    assert step_comm("zero3", grad_accum=1, grad_bytes=2e9, **{**kw, "world": 1, "nodes": 1}).total_s == 0


def test_latency_costs_more_nodes_even_on_a_fast_fabric():
    run = RunShape(method="full", zero_stage=3, seq=2048, micro_batch=4, grad_accum=1, gradient_checkpointing=False)
    eff = [p.scaling_efficiency for p in scaling(resolve_model("Qwen/Qwen2.5-0.5B"), run, 128, 8, 3200, **H100)]
    assert eff[0] == pytest.approx(1.0) and eff[1] > 0.9
    assert eff[127] < eff[63] < eff[15] < eff[1]  # no plateau past two nodes


def test_sharding_inside_one_node_is_not_free():
    run = RunShape(method="lora", zero_stage=3, seq=2048, micro_batch=2, grad_accum=1)
    one = estimate_step(SEVEN, run, 1, 1, None, **H100)
    eight = estimate_step(SEVEN, run, 1, 8, None, **H100)
    assert eight.comm_s > 0 and eight.latency_s > 0 and eight.interference_s > 0
    assert eight.tokens_per_second < 8 * one.tokens_per_second


# ---------------------------------------------------------------- issue 30's wrong numbers

def test_uneven_gpu_counts_count_their_own_gpus():
    run = RunShape(method="lora", zero_stage=2, seq=1024, micro_batch=2, grad_accum=4)
    s = estimate_step(SEVEN, run, 2, 2, 100, world_size=3, **H100)
    assert s.tokens_per_step == 1024 * 2 * 4 * 3 and s.world_size == 3
    p = Path(REPO / "presets" / "qwen2.5-7b-lora-2node-zero2.yaml").read_text()
    assert estimate_step(SEVEN, run, 2, 2, 100, **H100).tokens_per_step == 1024 * 2 * 4 * 4
    assert "gpus: 8" in p


def test_uneven_preset_report(tmp_path, capsys):
    text = (REPO / "presets" / "qwen2.5-7b-lora-2node-zero2.yaml").read_text()
    first, rest = text.split("gpus: 8", 1)
    path = tmp_path / "uneven.yaml"
    path.write_text(first + "gpus: 2" + rest.replace("gpus: 8", "gpus: 1", 1))
    assert main(["estimate", str(path), "--gpu", "H100", "--bus-gbps", "100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    t = out["step"]
    assert out["world_size"] == 3 and t["world_size"] == 3
    assert out["tokens_per_step"] == t["tokens_per_step"]
    from qwen_tui.preset.files import load_preset

    tr = load_preset(path).training
    assert out["tokens_per_step"] == tr.per_device_train_batch_size * tr.model_max_length * \
        tr.gradient_accumulation_steps * 3


def test_zero3_gathers_a_4bit_base_at_its_packed_size():
    lora = estimate_step(SEVEN, RunShape(method="lora", zero_stage=3, seq=1024, micro_batch=2), 2, 8, 100, **H100)
    qlora = estimate_step(SEVEN, RunShape(method="qlora", zero_stage=3, seq=1024, micro_batch=2), 2, 8, 100, **H100)
    # the decoder's projections (most of 7B) travel at ~0.52 bytes instead of 2
    assert qlora.comm_bytes_per_gpu < 0.45 * lora.comm_bytes_per_gpu
    assert qlora.comm_bytes_per_gpu > 0.2 * lora.comm_bytes_per_gpu


def test_a_new_preset_shows_no_absurd_speed(capsys):
    from qwen_tui.advice.report import summary
    from qwen_tui.cluster.facts import ClusterFacts as CF
    from qwen_tui.wizard.state import new_preset

    p = new_preset()
    est = summary(p, CF())
    assert est.tokens_per_s is None or est.tokens_per_s < 2e6
    assert est.tokens_per_s is None and any("pick a GPU type" in n for n in est.notes)  # no GPU type: unknown
    tiny = resolve_model("builtin:tiny")
    s = estimate_step(tiny, p.training, 1, 1, None, **H100)
    assert s.tokens_per_second < 2e6  # a tiny model is host-bound: ~100 operators a layer, ~10 us each


def test_unknown_gpu_and_unknown_link_print_unknown_and_how_to_learn_it(capsys, tmp_path):
    preset = REPO / "presets" / "qwen2.5-7b-lora-2node-zero2.yaml"
    assert main(["estimate", str(preset), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_s"] is None and out["tokens_per_second"] is None and out["step"] is None
    assert out["scaling_efficiency"] == [] and out["gpu"]["name"] is None
    assert any("GPU type unknown" in w for w in out["speed_unknown"])
    assert out["bandwidth"]["source"] == "unknown" and out["bandwidth_gbps"] is None
    assert main(["estimate", str(preset), "--gpu", "H100"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "s/step and tokens/s unknown" in text and "qwen-tui check" in text and "bus_gbps" not in text
    rows = text.split("no overlap", 1)[1]
    assert "unknown" in rows and "2880" not in text
    # the rehearsal's figure from a check's facts: used, and named
    facts = ClusterFacts(nodes={i: ib_node(i) for i in range(2)}, rehearsal_bandwidth_gbps=1234.5,
                         rehearsal_size_mb=256, rehearsal_ok=True)
    path = tmp_path / "check.json"
    path.write_text(json.dumps({"facts": facts.to_dict(), "findings": []}))  # `qwen-tui check --out` shape
    assert main(["estimate", str(preset), "--facts", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bandwidth"]["source"] == "rehearsal" and out["step"]["bus_gbps"] == 1234.5
    assert out["tokens_per_second"] > 0 and all(p["scaling_efficiency"] for p in out["scaling_efficiency"])
    assert main(["estimate", str(preset), "--facts", str(path)]) == 0
    assert "rehearsal all-reduce bus bandwidth 1.23e+03 Gbit/s at 256 MB" in " ".join(capsys.readouterr().out.split())


def test_nic_flags(capsys):
    preset = REPO / "presets" / "qwen2.5-14b-full-4node-zero3.yaml"
    assert main(["estimate", str(preset), "--gpu", "H100", "--nic-gbps", "400", "--nics", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bandwidth"]["source"] == "nics" and out["bandwidth_gbps"] == pytest.approx(3200 * NIC_EFFICIENCY)
    one = main(["estimate", str(preset), "--gpu", "H100", "--bus-gbps", "400", "--json"])
    assert one == 0
    single = json.loads(capsys.readouterr().out)
    # the old spelling still works, says what it is now, and keeps --json's output clean
    assert main(["estimate", str(preset), "--gpu", "H100", "--bandwidth-gbps", "400", "--json"]) == 0
    old = capsys.readouterr()
    assert json.loads(old.out) == single and "--bandwidth-gbps is deprecated" in old.err and "--bus-gbps" in old.err
    # 8 x 400G NICs are not one 400G link: typing the per-NIC rate as the bus bandwidth predicts far less
    assert out["scaling_efficiency"][1]["scaling_efficiency"] > single["scaling_efficiency"][1]["scaling_efficiency"]
    assert main(["estimate", str(preset), "--nics", "8"]) == 2
    assert "--nics needs --nic-gbps" in capsys.readouterr().err
    assert main(["estimate", str(preset), "--bus-gbps", "-5"]) == 2
    assert "--bus-gbps must be positive" in capsys.readouterr().err


def test_nodes_worth_it_follows_the_link():
    run = RunShape(method="full", zero_stage=3, seq=2048, micro_batch=2, grad_accum=1)
    slow = nodes_worth_it(SEVEN, run, 8, 25, **H100)
    fast = nodes_worth_it(SEVEN, run, 8, 3200, **H100)
    assert slow is not None and fast is not None and slow < fast
    assert nodes_worth_it(SEVEN, run, 8, None, **H100) is None


def test_advice_names_the_bandwidth_source():
    from qwen_tui.advice.rules import advise
    from qwen_tui.preset.schema import Preset

    p = Preset.model_validate({
        "cluster": {"nodes": [{"host": f"gpu{i}", "gpus": 8} for i in range(8)], "shared_storage": True},
        "training": {"model": "Qwen/Qwen2.5-7B-Instruct", "data": "/d.jsonl", "method": "full", "zero_stage": 3,
                     "model_max_length": 2048, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1}})
    f = ClusterFacts(nodes={i: ib_node(i, ports=1, rate="25 Gb/sec (1X EDR)") for i in range(8)})
    adv = {a.code: a for a in advise(p, f)}
    assert "ZERO3_SLOW_LINK" in adv and "(ib-ports)" in adv["ZERO3_SLOW_LINK"].message
    assert "NODES_PAST_WORTH" in adv and "(ib-ports)" in adv["NODES_PAST_WORTH"].message
    # nothing measured: neither figure is guessed
    codes = {a.code for a in advise(p, ClusterFacts(nodes={i: ib_node(i, ports=0) for i in range(8)}))}
    assert not {"ZERO3_SLOW_LINK", "NODES_PAST_WORTH"} & codes


# ---------------------------------------------------------------- calibration and speed

def _calibration():
    path = REPO / "bench" / "multinode_calibration.py"
    spec = importlib.util.spec_from_file_location("multinode_calibration", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look themselves up there
    spec.loader.exec_module(mod)
    return mod


def test_model_holds_the_published_multinode_measurements():
    """docs/multinode-calibration.md: every published point within 0.10 of its measured efficiency, most within
    0.05. Each point comes from a public table (source in the script); the model gets the shape, the GPU, the link
    and the base point's measured speed, nothing fitted."""
    cal = _calibration()
    pts = cal.points()
    assert len(pts) >= 20 and {p.series.source for p in pts} >= {cal.LLM_FOUNDRY, cal.TORCHTITAN}
    assert max(p.gpus for p in pts) >= 512 and sum(p.gpus > 256 for p in pts) >= 6  # past 256 GPUs too
    errs = [abs(p.predicted - p.measured) for p in pts]
    assert max(errs) <= 0.10, [(p.series.setup, p.gpus, p.measured, p.predicted) for p in pts]
    assert sum(e <= 0.05 for e in errs) >= 0.8 * len(errs)
    doc = (REPO / "docs" / "multinode-calibration.md").read_text()
    assert cal.table() in doc  # the document shows what the model predicts today
    assert cal.qwen_unexplained() in doc  # and what it cannot explain, with its numbers


def test_an_estimate_is_fast_enough_for_every_edit():
    cal = _calibration()
    assert cal.time_per_call(300) < 0.003  # the wizard calls it on every keystroke (~40 us measured idle)


# ---------------------------------------------------------------- the rehearsal's message size

def test_rehearsal_measures_at_a_buckets_size_on_gpus(monkeypatch):
    from qwen_tui.nodes.checks.rehearsal import ALLREDUCE_BUDGET_S, SNIPPET, rehearsal_argv, rehearsal_size_mb

    monkeypatch.delenv("QWEN_TUI_REHEARSAL_MB", raising=False)
    assert rehearsal_size_mb("nccl") == REHEARSAL_BUCKET_MB >= 256
    assert rehearsal_size_mb("gloo") == 32
    monkeypatch.setenv("QWEN_TUI_REHEARSAL_MB", "64")
    assert rehearsal_size_mb("nccl") == 64
    for bad in ("x", "0", "-3"):
        monkeypatch.setenv("QWEN_TUI_REHEARSAL_MB", bad)
        with pytest.raises(ValueError, match="QWEN_TUI_REHEARSAL_MB"):
            rehearsal_size_mb("nccl")
    argv = rehearsal_argv(["torchrun", "--nnodes", "2", "-m", "training.finetune", "--x"], "/py", 256, 30)
    assert argv[-3:] == ["256", "30", f"{ALLREDUCE_BUDGET_S:g}"] and argv[argv.index("-c") + 1] == SNIPPET
    compile(SNIPPET, "rehearsal", "exec")  # what every rank runs parses
