"""What the advice rules are made of: Advice and its Fix, apply_fix, the Context a rule looks at, and the rule
registry (qwen_tui.advice.rules runs the rules; qwen_tui.advice.cluster holds the ones about the nodes' facts)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..base.levels import Issue
from ..cluster.facts import ClusterFacts, NodeFacts
from ..model.spec import ModelSpec, UnknownModel, resolve_model
from ..plan.estimate import GPUS, GPUSpec, MemoryEstimate, estimate_memory, gpu_spec
from ..plan.estimate_comm import Bandwidth, resolve_bandwidth
from ..preset.schema import Preset

LOW_BANDWIDTH_GBPS = 10.0
# LoRA recipes train well from 8 records a step (QLoRA's 7B-65B runs used 16; Qwen's and Alpaca-LoRA's scripts
# 128) up to a few hundred; below 8 the updates get noisy at LoRA's usual learning rates. The demo (16) and a new
# preset (1 x 8 accumulation on one GPU) sit inside.
LORA_BATCH_MIN, LORA_BATCH_MAX = 8, 256
RDZV_TIMEOUT_MAX_S = 600
NCCL_TIMEOUT_MAX_S = 3 * 3600
MEMORY_TIGHT = 0.90  # of the GPU: fits, but a longer batch may not
CKPT_OFF_HEADROOM = 0.85  # checkpointing off must leave this much of the GPU unused to be recommended
ZERO3_SLOWER = 1.2  # ZeRO-3 at least this much slower than ZeRO-2 to warn
DDP_FASTER = 1.2  # plain DDP (the worker's fast path) at least this much faster than ZeRO to warn
QLORA_QUANT_METHODS = ("gptq", "awq", "bitsandbytes")  # what training/model/pretrained.py can put LoRA on


@dataclass(frozen=True)
class Fix:
    """One action: `changes` maps dotted preset paths (`training.zero_stage`,
    `cluster.nodes.1.gpus`) to new values; `hint` says what to do outside the
    preset when no preset change can help (then `changes` is empty)."""

    label: str
    changes: dict[str, Any] = field(default_factory=dict)
    hint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "changes": dict(self.changes), "hint": self.hint}


@dataclass(frozen=True)
class Advice(Issue):
    """An Issue about the preset (level, code, message), with the preset change that fixes it when one can."""

    fix: Fix | None = None
    node: int | None = None  # the node it is about, when it is about one

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "level": str(self.level), "message": self.message,
                "fix": self.fix.to_dict() if self.fix else None, "node": self.node}


def apply_fix(preset: Preset, fix: Fix) -> Preset:
    """A new preset with the fix's changes, validated; the given preset is left as it was.

    Fields the preset leaves at their defaults stay unset (exclude_unset): a local node's
    `python` that the preset never gave must stay unset, or the plan runs "python3" there
    instead of qwen-tui's own interpreter."""
    return preset.with_changes(fix.changes)  # the one edit by dotted path (Preset.with_changes)


# ---------------------------------------------------------------- what the rules look at

@dataclass
class Context:
    preset: Preset
    facts: ClusterFacts | None
    spec: ModelSpec | None
    spec_error: str | None
    gpu: GPUSpec | None  # for FLOPs and intra-node bandwidth
    gpu_memory_gib: float | None  # smallest GPU's memory; None = unknown
    gpu_memory_where: str
    bandwidth: Bandwidth  # between nodes: per-node bus bandwidth and its source (estimate_comm.resolve_bandwidth)
    efficiency: float | None  # None: the worker path's (estimate.path_efficiency)
    cpu: bool
    intra_node_gbs: float | None = None  # NCCL bus bandwidth inside a node, GB/s (None: the GPU table's)

    @property
    def bandwidth_gbps(self) -> float | None:
        return self.bandwidth.gbps

    @property
    def speed_known(self) -> bool:
        """Step time and tokens/s can be said for this cluster: a GPU type, and a link when there are nodes."""
        return self.gpu is not None and not self.cpu and (self.nodes == 1 or self.bandwidth.known)

    @property
    def nodes(self) -> int:
        return len(self.preset.cluster.nodes)

    @property
    def t(self):
        return self.preset.training

    def node_facts(self) -> Iterable[tuple[int, NodeFacts]]:
        if self.facts:
            for i in sorted(self.facts.nodes):
                if self.facts.nodes[i].error is None:
                    yield i, self.facts.nodes[i]

    def memory(self, **overrides: Any) -> MemoryEstimate:
        assert self.spec is not None
        return estimate_memory(self.spec, self.t, self.preset.world_size, **overrides)

    def torchao_missing(self) -> list[int]:
        """The GPU nodes whose probe found no torchao (the worker's FP8 needs it on every rank)."""
        return [i for i, nf in self.node_facts() if nf.gpus and "torchao" in nf.versions and nf.versions["torchao"] is None]

    @property
    def fp8_gpu(self) -> bool | None:
        """Whether the worker can run FP8 matmuls here: the GPU type has FP8 tensor cores and no probed node lacks
        torchao (None: the GPU type is unknown)."""
        if self.gpu is None or self.cpu:
            return None if not self.cpu else False
        return self.gpu.fp8 and not self.torchao_missing() if self.gpu.fp8 is not None else None

    def step_kwargs(self) -> dict[str, Any]:
        """The GPU's figures for estimate_step. With the GPU type unknown these are an H100's: a caller shows no
        speed then (speed_known), and a rule compares two estimates only."""
        g = self.gpu or GPUS["H100"]
        return dict(gpu_tflops=g.bf16_tflops, efficiency=self.efficiency,
                    intra_node_gbs=self.intra_node_gbs or g.intra_node_gbs, hbm_gbs=g.hbm_gbs, fp8_gpu=self.fp8_gpu,
                    gpu_gib=g.memory_gib)

    def step_here(self, **overrides: Any):
        """estimate_step for this preset's own cluster (its nodes, its real GPU count)."""
        from ..plan.estimate_time import estimate_step

        assert self.spec is not None
        return estimate_step(self.spec, self.t, self.nodes, self.gpus_per_node(), self.bandwidth_gbps,
                             world_size=self.preset.world_size, **{**self.step_kwargs(), **overrides})

    def gpus_per_node(self) -> int:
        return max(n.gpus for n in self.preset.cluster.nodes)


def probed_intra_node_gbs(preset: Preset, facts: ClusterFacts) -> float | None:
    """The slowest node's GPU bus from its probed topology (NVSwitch, NVLink or PCIe: nodes/checks/topology.py), in
    GB/s; None where no node of several GPUs has a topology."""
    from ..nodes.checks.topology import node_intra_bus

    nodes = preset.cluster.nodes
    buses = [node_intra_bus(nf, nodes[i].gpus) for i, nf in facts.nodes.items() if i < len(nodes)]
    known = [b.gbs for b in buses if b is not None]
    return min(known) if known else None


def make_context(preset: Preset, facts: ClusterFacts | None = None, *, spec: ModelSpec | None = None,
                 gpu: str | GPUSpec | None = None, gpu_memory_gib: float | None = None,
                 bandwidth_gbps: float | None = None, efficiency: float | None = None,
                 base_dir: str | None = None, nic_gbps: float | None = None, nics: int | None = None,
                 intra_node_gbs: float | None = None) -> Context:
    """What the rules look at. bandwidth_gbps: per-node bus bandwidth between nodes (overrides the facts);
    nic_gbps x nics: the NICs NCCL uses, when no bus bandwidth is known; intra_node_gbs: NCCL bus bandwidth
    inside a node in GB/s (from the node's GPU topology; default: the GPU table's)."""
    spec_error = None
    if spec is None:
        try:
            spec = resolve_model(preset.training.model, base_dir)
        except UnknownModel as e:
            spec_error = str(e)
    gspec = gpu_spec(gpu) if isinstance(gpu, str) else gpu
    where = f"--gpu-memory-gib {gpu_memory_gib}" if gpu_memory_gib else ""
    mem = gpu_memory_gib
    cpu = preset.training.device == "cpu"
    if facts:
        probed = [(nf.gpu_memory_gib, i, nf) for i, nf in facts.nodes.items() if nf.gpus]
        if any(nf.gpus == [] for nf in facts.nodes.values()):
            cpu = True
        if probed:
            low, i, nf = min(probed, key=lambda x: x[0])
            if mem is None:
                mem, where = low, f"{nf.gpu_model} on node {i}"
            if gspec is None:  # the probed type, also where the memory was given
                gspec = gpu_spec(nf.gpu_model or "", nf.gpus[0].memory_total_mib)
    if mem is None and gspec is not None:
        mem, where = gspec.memory_gib, gspec.name
    bw = resolve_bandwidth(facts, given_gbps=bandwidth_gbps, nic_gbps=nic_gbps, nics=nics,
                           ib_disabled=bool(preset.network.nccl_ib_disable))
    if intra_node_gbs is None and facts:
        intra_node_gbs = probed_intra_node_gbs(preset, facts)
    return Context(preset=preset, facts=facts, spec=spec, spec_error=spec_error, gpu=gspec, gpu_memory_gib=mem,
                   gpu_memory_where=where, bandwidth=bw, efficiency=efficiency, cpu=cpu,
                   intra_node_gbs=intra_node_gbs)


def _gb(x: float) -> str:
    return f"{x:.1f} GiB"


Rule = Callable[[Context], Iterable[Advice]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


