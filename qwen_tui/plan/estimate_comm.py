"""Communication between GPUs and nodes for the step-time estimate: which bandwidth, how long each collective
takes, how much of it hides under compute (pure; no torch, no I/O).

The bandwidth between nodes (`resolve_bandwidth`)
=================================================
The figure that matters is NCCL's own all-reduce *bus bandwidth* between nodes, per node, in Gbit/s: what
nccl-tests calls busbw (bytes x 2(n-1)/n / time, NCCL's PERFORMANCE.md). On a ring across nodes it is the sum of
the NICs NCCL drives on a node, whatever the number of GPUs. In order of trust:

1. `--bus-gbps` (given): that figure, as the user measured it;
2. the rehearsal of `qwen-tui check`: NCCL (or gloo) all-reduce over the run's own settings, at a message of
   REHEARSAL_BUCKET_MB (the size of the run's buckets; a smaller message reads low and says so);
3. `--nic-gbps R --nics K`, or the InfiniBand/RoCE ports the probe found ACTIVE on every node: R x K x
   NIC_EFFICIENCY;
4. iperf3 over TCP to the master (the check's bandwidth column): a lower bound. It measures one TCP path over
   whatever interface routes to the master, often the front-end network NCCL does not use.

With none of these the link is unknown and multi-node speed is "unknown", never a guess.

Time of one collective (`collective_s`)
=======================================
latency + algorithm bytes / bus bandwidth (NCCL's own model, src/graph/tuning.cc, Simple protocol for the
large messages of training): a ring of R ranks on n nodes takes R-1 steps per pass (all-gather,
reduce-scatter; 2x for all-reduce), n-1 of them over the network; a tree all-reduce takes 2((R/n - 1) x intra
+ log2(n) x network). NCCL picks the faster of the two for all-reduce; all-gather and reduce-scatter only run
as rings, so their latency grows with the rank count. The bandwidth is the slower of the link inside a node
(NVLink/PCIe, GPU table or the node's topology) and, with several nodes, the link between nodes.

Overlap (`StepComm`, built by estimate_time.estimate_step)
=====================================================
What can hide under compute does, except:

- the bandwidth part of every collective beyond its window (DDP's all-reduce and ZeRO-2's reduce-scatter under
  the backward of the same micro-batch; ZeRO-3's gathers under forward and backward);
- the last gradient bucket of every backward (nothing left to hide it under: with accumulation 1 that is the
  whole of a small model's reduction), ZeRO-3's first layer gather of each forward, ZeRO-2's weight all-gather
  after the optimizer step;
- the latency of every collective: each one synchronises all ranks, and the next layer waits on it. Fitted
  nowhere: it is NCCL's figure, and comes close to the 0.1-0.7 ms per added GPU that the published FSDP runs in
  docs/multinode-calibration.md lose (table there);
- while a collective runs beside compute, it takes NCCL_SM_SHARE of the GPU's streaming multiprocessors: hidden
  communication still slows compute by that share of its duration.

The slowest GPU (`slowest_gpu_factor`)
======================================
A synchronous step goes at the pace of its slowest GPU. GPUs of one SKU in one cluster differ: 8% average
performance variation (22% at most) across Summit, Frontera, Longhorn, Vortex and Corona (Sinha et al., "Not All
GPUs Are Created Equal", SC'22), read as a spread of about 4 standard deviations: sigma = GPU_SPREAD_SIGMA of the
compute time. The expected slowest of N such GPUs is sigma x the expected maximum of N standard normals (Blom's
approximation), so a single GPU, as measured, pays nothing and 8 GPUs ~3%.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

# NCCL's latency model (src/graph/tuning.cc, NCCL 2.8-2.10, Simple protocol), microseconds.
RING_BASE_US = 8.4
RING_HOP_US = {"nvlink": 3.4, "pcie": 5.7, "net": 9.6}
TREE_HOP_US = {"nvlink": 28.0, "pcie": 28.0, "net": 50.0}
# NCCL's tuning model multiplies a multi-node ring all-reduce's latency by 1.9 for large messages ("plateau").
RING_ALLREDUCE_PLATEAU = 1.9

# NCCL runs one CTA per channel; up to 16 channels on 132 SMs (H100) is ~12% of the GPU while a collective runs.
NCCL_SM_SHARE = 16 / 132

# NICs -> bus bandwidth: 8 x NDR (400 GB/s of NICs) measures 400-450 GB/s all-reduce busbw on 2 H100 nodes,
# 8 x HDR (200 GB/s) 250-300 on A100 (Saturn Cloud's NCCL validation guide, "Expected Performance"): on 2 nodes
# NCCL's tree does better than the NICs' rate; rings across many nodes approach it. 0.9 keeps the estimate on
# the safe side of both.
NIC_EFFICIENCY = 0.9

# The rehearsal's all-reduce message: DeepSpeed's default reduce bucket is 5e8 elements, ours 2e8 (bf16: 400 MB),
# DDP's 25 MB; bus bandwidth flattens out above ~128-256 MB on IB fabrics (nccl-tests sweeps). Below this size the
# measured figure reads low.
REHEARSAL_BUCKET_MB = 256

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP bucket_cap_mb default
DS_REDUCE_BUCKET_ELEMENTS = 200_000_000  # training/ds_config_zero2.json reduce_bucket_size / allgather_bucket_size

# PyTorch eager runs ~10 us of host work per operator (Horace He, "Making Deep Learning Go Brrrr From First
# Principles", 2022: overhead section). A Qwen2 decoder layer's forward issues ~35 kernels (two RMSNorms of ~6,
# q/k/v/o/gate/up/down, rotary ~8, attention, SiLU, product, residuals), its backward about twice that: ~100.
# A micro-batch never runs faster than its host can issue it (tiny models are host-bound).
EAGER_OP_S = 10e-6
OPS_PER_LAYER_STEP = 100

GPU_SPREAD_SIGMA = 0.02  # of the compute time (Sinha et al. SC'22; module docstring)

_RATE = re.compile(r"([0-9.]+)\s*Gb")


@dataclass(frozen=True)
class Bandwidth:
    """The bandwidth between nodes the estimate uses: per-node all-reduce bus bandwidth, Gbit/s."""

    gbps: float | None  # None: unknown
    source: str  # given | rehearsal | nics | ib-ports | iperf3 | unknown
    detail: str  # one line for a person: where the figure came from
    lower_bound: bool = False

    @property
    def known(self) -> bool:
        return self.gbps is not None and self.gbps > 0

    def to_dict(self) -> dict[str, Any]:
        return {"gbps": None if self.gbps is None else round(self.gbps, 3), "source": self.source,
                "detail": self.detail, "lower_bound": self.lower_bound}


MEASURE_HINT = ("run `qwen-tui check` (its rehearsal measures NCCL's all-reduce between the nodes) and pass "
                "--facts, or give --bus-gbps (per-node bus bandwidth) or --nic-gbps with --nics")


def port_gbps(rate: str | None) -> float | None:
    """"400 Gb/sec (4X NDR)" -> 400.0; None when the rate is not there."""
    m = _RATE.search(rate or "")
    return float(m.group(1)) if m else None


def ib_ports_gbps(nodes: Iterable[Any]) -> tuple[float | None, str]:
    """The slowest node's sum of ACTIVE InfiniBand/RoCE port rates (NodeFacts with ib_ports), and a line
    naming it; (None, why) when any node has none or a rate is missing."""
    per_node = []
    for i, nf in nodes:
        act = [p for p in nf.ib_ports if p.state == "ACTIVE"]
        rates = [port_gbps(p.rate) for p in act]
        if not act or any(r is None for r in rates):
            return None, f"node {i} has no active InfiniBand/RoCE port with a known rate"
        per_node.append((sum(r for r in rates if r), len(act), i))
    if not per_node:
        return None, "no node probed for InfiniBand/RoCE"
    total, count, i = min(per_node)
    return total, f"{count} active port(s) on node {i}, {total:g} Gbit/s"


def resolve_bandwidth(facts: Any = None, *, given_gbps: float | None = None, nic_gbps: float | None = None,
                      nics: int | None = None, ib_disabled: bool = False) -> Bandwidth:
    """The bandwidth between nodes and where it came from (order in the module docstring)."""
    if given_gbps is not None:
        return Bandwidth(float(given_gbps), "given", f"--bus-gbps {given_gbps:g} (per-node bus bandwidth)")
    # a rehearsal on one node measured the link inside it (NVLink, PCIe), not the one between nodes
    if facts is not None and getattr(facts, "rehearsal_bandwidth_gbps", None) and facts.rehearsal_nodes != 1:
        bw = float(facts.rehearsal_bandwidth_gbps)
        size = getattr(facts, "rehearsal_size_mb", None)
        detail = f"rehearsal all-reduce bus bandwidth {bw:.3g} Gbit/s"
        if size:
            detail += f" at {size:g} MB"
            if size < REHEARSAL_BUCKET_MB:
                detail += f" (below the {REHEARSAL_BUCKET_MB} MB of a bucket: reads low)"
        return Bandwidth(bw, "rehearsal", detail, lower_bound=bool(size and size < REHEARSAL_BUCKET_MB))
    if nic_gbps is not None:
        k = nics or 1
        return Bandwidth(nic_gbps * k * NIC_EFFICIENCY, "nics",
                         f"--nic-gbps {nic_gbps:g} x {k} NIC(s) x {NIC_EFFICIENCY} (NCCL's share of the line rate)")
    if facts is not None and not ib_disabled and facts.nodes:
        nodes = [(i, nf) for i, nf in sorted(facts.nodes.items()) if nf.error is None]
        total, why = ib_ports_gbps(nodes)
        if total is not None and len(nodes) == len(facts.nodes):
            return Bandwidth(total * NIC_EFFICIENCY, "ib-ports",
                             f"InfiniBand/RoCE from the probe: {why} x {NIC_EFFICIENCY}")
    if facts is not None:
        vals = [lk.bandwidth_gbps for lk in facts.links.values() if lk.bandwidth_gbps is not None]
        if vals:
            bw = min(vals)
            return Bandwidth(bw, "iperf3", f"iperf3 TCP to the master {bw:g} Gbit/s: a lower bound (one TCP path, "
                             "maybe not the network NCCL uses)", lower_bound=True)
    return Bandwidth(None, "unknown", "not measured: " + MEASURE_HINT)


# ---------------------------------------------------------------- one collective

def intra_kind(intra_node_gbs: float) -> str:
    """NVLink or PCIe inside a node, from its bus bandwidth (PCIe Gen5 x16 tops out near 64 GB/s)."""
    return "nvlink" if intra_node_gbs > 64 else "pcie"


def latency_s(coll: str, ranks: int, nodes: int, intra: str) -> float:
    """NCCL's latency for one collective (`allreduce`, `allgather`, `reducescatter`) over `ranks` on `nodes`."""
    if ranks <= 1:
        return 0.0
    nodes = max(1, min(nodes, ranks))
    hop_net = RING_HOP_US["net"] if nodes > 1 else RING_HOP_US[intra]
    if coll == "allreduce":
        steps, inter = 2 * (ranks - 1), 2 * (nodes - 1)
    else:
        steps, inter = ranks - 1, nodes - 1
    ring = RING_BASE_US + (steps - inter) * RING_HOP_US[intra] + inter * hop_net
    if coll != "allreduce":
        return ring * 1e-6
    if nodes > 1:
        ring *= RING_ALLREDUCE_PLATEAU
    per_node = max(1, ranks // nodes)
    tree = 2 * ((per_node - 1) * TREE_HOP_US[intra] + math.log2(nodes) * TREE_HOP_US["net"]) if nodes > 1 else ring
    return min(ring, tree) * 1e-6


def ring_factor(coll: str, ranks: int) -> float:
    """Bytes each rank moves per byte of the message (nccl-tests PERFORMANCE.md)."""
    if ranks <= 1:
        return 0.0
    return (2 if coll == "allreduce" else 1) * (ranks - 1) / ranks


def collective_s(coll: str, nbytes: float, ranks: int, nodes: int, bus_Bps: float, intra: str) -> float:
    """Latency + algorithm bytes over the bus bandwidth (bytes/s)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return latency_s(coll, ranks, nodes, intra) + ring_factor(coll, ranks) * nbytes / bus_Bps


# ---------------------------------------------------------------- a step's communication

@dataclass
class StepComm:
    """A step's communication: bytes each rank sends, all of it back to back, what the step waits on, and
    what it costs the compute it runs beside."""

    bytes_per_gpu: float = 0.0
    total_s: float = 0.0
    exposed_s: float = 0.0
    latency_s: float = 0.0  # part of exposed_s
    interference_s: float = 0.0
    collectives: int = 0


def step_comm(strategy: str, *, world: int, nodes: int, bus_Bps: float, intra: str, grad_accum: int, layers: int,
              grad_bytes: float, param_bytes: float, layer_param_bytes: float, gathers_per_micro: int,
              fwd_window: float, bwd_window: float) -> StepComm:
    """What one optimizer step communicates and waits for (see the module docstring).

    grad_bytes: the gradients that are reduced (trainable parameters x their dtype);
    param_bytes: the weights ZeRO gathers (ZeRO-3: every parameter, as stored: 4-bit bases at their packed size;
    ZeRO-2: the trainable ones, after the step); layer_param_bytes: one decoder layer of those;
    fwd_window / bwd_window: one micro-batch's forward / backward compute, seconds.
    """
    c = StepComm()
    if world <= 1:
        return c

    def t(coll: str, nbytes: float) -> float:
        return collective_s(coll, nbytes, world, nodes, bus_Bps, intra)

    def lat(coll: str) -> float:
        return latency_s(coll, world, nodes, intra)

    if strategy == "ddp":
        buckets = max(1, math.ceil(grad_bytes / DDP_BUCKET_BYTES))
        last = min(grad_bytes, DDP_BUCKET_BYTES)
        bw = ring_factor("allreduce", world) * grad_bytes / bus_Bps
        c.collectives = buckets
        c.latency_s = buckets * lat("allreduce")
        c.total_s = bw + c.latency_s
        hidden = min(max(0.0, bw - ring_factor("allreduce", world) * last / bus_Bps), bwd_window)
        c.exposed_s = c.total_s - hidden
        c.bytes_per_gpu = ring_factor("allreduce", world) * grad_bytes
    elif strategy in ("zero1", "zero2"):
        # ZeRO-2 reduce-scatters every micro-batch (its gradients are partitioned); ZeRO-1 keeps whole gradients
        # and reduces once, in the step's last backward. Both all-gather the updated weights after the step.
        reductions = grad_accum if strategy == "zero2" else 1
        bucket = 2 * DS_REDUCE_BUCKET_ELEMENTS
        rs_buckets = max(1, math.ceil(grad_bytes / bucket))
        ag_buckets = max(1, math.ceil(param_bytes / bucket))
        rs_bw = ring_factor("reducescatter", world) * grad_bytes / bus_Bps
        last = ring_factor("reducescatter", world) * min(grad_bytes, bucket) / bus_Bps
        ag_bw = ring_factor("allgather", world) * param_bytes / bus_Bps
        micro_lat = rs_buckets * lat("reducescatter")
        step_lat = ag_buckets * lat("allgather")
        hidden = min(max(0.0, rs_bw - last), bwd_window)
        c.collectives = reductions * rs_buckets + ag_buckets
        c.latency_s = reductions * micro_lat + step_lat
        c.total_s = reductions * (rs_bw + micro_lat) + ag_bw + step_lat
        c.exposed_s = c.total_s - reductions * hidden
        c.bytes_per_gpu = ring_factor("reducescatter", world) * (reductions * grad_bytes + param_bytes)
    else:  # zero3: gathers in forward, backward (and the recompute), reduce-scatter in backward, every micro-batch
        fwd_gather = ring_factor("allgather", world) * param_bytes / bus_Bps
        bwd_gathers = (gathers_per_micro - 1) * fwd_gather
        rs_bw = ring_factor("reducescatter", world) * grad_bytes / bus_Bps
        first = ring_factor("allgather", world) * layer_param_bytes / bus_Bps
        last = rs_bw / max(1, layers)
        per_micro_coll = gathers_per_micro * layers + layers
        micro_lat = gathers_per_micro * layers * lat("allgather") + layers * lat("reducescatter")
        hide_f = min(max(0.0, fwd_gather - first), fwd_window)
        hide_b = min(max(0.0, bwd_gathers + rs_bw - last), bwd_window)
        micro = fwd_gather + bwd_gathers + rs_bw
        c.collectives = grad_accum * per_micro_coll
        c.latency_s = grad_accum * micro_lat
        c.total_s = grad_accum * (micro + micro_lat)
        c.exposed_s = c.total_s - grad_accum * (hide_f + hide_b)
        c.bytes_per_gpu = grad_accum * (ring_factor("allgather", world) * gathers_per_micro * param_bytes
                                        + ring_factor("reducescatter", world) * grad_bytes)
    c.interference_s = NCCL_SM_SHARE * (c.total_s - c.exposed_s)
    return c


def slowest_gpu_factor(gpus: int) -> float:
    """Compute time of the slowest of `gpus` GPUs over a typical one's (module docstring): 1 for one GPU."""
    if gpus <= 1:
        return 1.0
    return 1.0 + GPU_SPREAD_SIGMA * NormalDist().inv_cdf((gpus - 0.375) / (gpus + 0.25))


def host_floor_s(layers: int) -> float:
    """The least one micro-batch's forward and backward take on the host that issues them (module docstring)."""
    return (layers + 2) * OPS_PER_LAYER_STEP * EAGER_OP_S
