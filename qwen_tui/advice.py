"""The rules behind the live warnings: plain functions over (preset, facts).

`advise(preset, facts)` runs every rule in RULES and returns a list of Advice,
errors first. Each rule is a small function that yields zero or more Advice; each
Advice has a stable `code` (documented in docs/advice.md), a level, a one-line
message with the numbers that triggered it, and where one preset change can fix
it, a `Fix`. Nothing here changes a preset: `apply_fix` returns a new, validated
one, and only when the user accepts it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Optional

from pydantic import BaseModel

from .estimate import (
    GPUS, GPUSpec, MemoryEstimate, estimate_memory, estimate_step, gpu_spec, max_micro_batch,
)
from .facts import ClusterFacts, NodeFacts
from .modelspec import ModelSpec, UnknownModel, resolve_model
from .preset import Preset

Level = Literal["info", "warning", "error"]
LEVEL_ORDER = {"error": 0, "warning": 1, "info": 2}
LOW_BANDWIDTH_GBPS = 10.0
LORA_BATCH_MIN, LORA_BATCH_MAX = 64, 256
RDZV_TIMEOUT_MAX_S = 600
NCCL_TIMEOUT_MAX_S = 3 * 3600
MEMORY_TIGHT = 0.90  # of the GPU: fits, but a longer batch may not
CKPT_OFF_HEADROOM = 0.85  # checkpointing off must leave this much of the GPU unused to be recommended
ZERO3_SLOWER = 1.2  # ZeRO-3 at least this much slower than ZeRO-2 to warn
DDP_FASTER = 1.2  # plain DDP (the worker's fast path) at least this much faster than ZeRO to warn
QLORA_QUANT_METHODS = ("gptq", "awq", "bitsandbytes")  # what training/model.py can put LoRA on


@dataclass(frozen=True)
class Fix:
    """One action: `changes` maps dotted preset paths (`training.zero_stage`,
    `cluster.nodes.1.gpus`) to new values; `hint` says what to do outside the
    preset when no preset change can help (then `changes` is empty)."""

    label: str
    changes: dict[str, Any] = field(default_factory=dict)
    hint: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "changes": dict(self.changes), "hint": self.hint}


@dataclass(frozen=True)
class Advice:
    level: Level
    code: str
    message: str
    fix: Optional[Fix] = None
    node: Optional[int] = None  # the node it is about, when it is about one

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "level": self.level, "message": self.message,
                "fix": self.fix.to_dict() if self.fix else None, "node": self.node}


def apply_fix(preset: Preset, fix: Fix) -> Preset:
    """A new preset with the fix's changes, validated; the given preset is left as it was.

    Fields the preset leaves at their defaults stay unset (exclude_unset): a local node's
    `python` that the preset never gave must stay unset, or the plan runs "python3" there
    instead of qwen-tui's own interpreter."""
    data = preset.model_dump(mode="python", exclude_unset=True)
    for path, value in fix.changes.items():
        parts = [int(p) if p.isdigit() else p for p in path.split(".")]
        obj: Any = preset  # the path must name a field of the model, set or not
        for p in parts:
            if isinstance(p, int):
                obj = obj[p]
            elif isinstance(obj, BaseModel) and p in type(obj).model_fields:
                obj = getattr(obj, p)
            else:
                raise KeyError(f"{path}: no such preset field")
        cur: Any = data
        for p in parts[:-1]:
            cur = cur[p] if isinstance(p, int) else cur.setdefault(p, {})
        cur[parts[-1]] = value
    return Preset.model_validate(data)


# ---------------------------------------------------------------- what the rules look at

@dataclass
class Context:
    preset: Preset
    facts: Optional[ClusterFacts]
    spec: Optional[ModelSpec]
    spec_error: Optional[str]
    gpu: Optional[GPUSpec]  # for FLOPs and intra-node bandwidth
    gpu_memory_gib: Optional[float]  # smallest GPU's memory; None = unknown
    gpu_memory_where: str
    bandwidth_gbps: Optional[float]
    efficiency: Optional[float]  # None: the worker path's (estimate.path_efficiency)
    cpu: bool

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

    def step_kwargs(self) -> dict[str, Any]:
        g = self.gpu or GPUS["H100"]
        return dict(gpu_tflops=g.bf16_tflops, efficiency=self.efficiency, intra_node_gbs=g.intra_node_gbs,
                    hbm_gbs=g.hbm_gbs)

    def gpus_per_node(self) -> int:
        return max(n.gpus for n in self.preset.cluster.nodes)


def make_context(preset: Preset, facts: Optional[ClusterFacts] = None, *, spec: Optional[ModelSpec] = None,
                 gpu: Optional[str | GPUSpec] = None, gpu_memory_gib: Optional[float] = None,
                 bandwidth_gbps: Optional[float] = None, efficiency: Optional[float] = None,
                 base_dir: Optional[str] = None) -> Context:
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
        if probed and mem is None:
            mem, i, nf = min(probed, key=lambda x: x[0])
            where = f"{nf.gpu_model} on node {i}"
            if gspec is None:
                gspec = gpu_spec(nf.gpu_model or "", nf.gpus[0].memory_total_mib)
    if mem is None and gspec is not None:
        mem, where = gspec.memory_gib, gspec.name
    if bandwidth_gbps is None and facts is not None:
        bandwidth_gbps = facts.min_bandwidth_gbps()
    return Context(preset=preset, facts=facts, spec=spec, spec_error=spec_error, gpu=gspec, gpu_memory_gib=mem,
                   gpu_memory_where=where, bandwidth_gbps=bandwidth_gbps, efficiency=efficiency, cpu=cpu)


def _gb(x: float) -> str:
    return f"{x:.1f} GiB"


Rule = Callable[[Context], Iterable[Advice]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


# ---------------------------------------------------------------- model and method

@rule
def model_unknown(c: Context) -> Iterable[Advice]:
    if c.spec is None:
        yield Advice("info", "MODEL_UNKNOWN", f"no memory or speed estimate: {c.spec_error}")


@rule
def int4_needs_qlora(c: Context) -> Iterable[Advice]:
    if c.spec is None or not c.spec.quantized or c.t.method == "qlora":
        return
    changes: dict[str, Any] = {"training.method": "qlora"}
    if c.t.zero_stage == 3:
        changes["training.zero_stage"] = 2
    yield Advice("error", "INT4_NEEDS_QLORA",
                 f"{c.t.model} is {c.spec.quant_method}-quantized ({c.spec.quant_bits or '?'}-bit): "
                 f"{c.t.method} fine-tuning cannot train it, only Q-LoRA can",
                 Fix("Use Q-LoRA", changes))


@rule
def qlora_full(c: Context) -> Iterable[Advice]:
    flags = {"--q_lora", "--load_in_4bit", "--load_in_8bit"}
    asked = [a for a in c.t.extra_args if a in flags]
    if c.t.method == "full" and asked:
        rest = [a for a in c.t.extra_args if a not in flags]
        yield Advice("error", "QLORA_FULL",
                     f"extra_args ask for {', '.join(asked)} with method full: quantized weights cannot be fully "
                     "fine-tuned",
                     Fix("Use Q-LoRA", {"training.method": "qlora", "training.extra_args": rest}))


@rule
def qlora_zero3(c: Context) -> Iterable[Advice]:
    """ZeRO-3 shards a base the worker quantizes to nf4 itself (stored in bf16, which DeepSpeed partitions); a
    GPTQ/AWQ checkpoint's packed integer weights it cannot."""
    q = c.spec.quant_method if c.spec is not None else None
    if c.t.method == "qlora" and c.t.zero_stage == 3 and q is not None:
        yield Advice("error", "QLORA_ZERO3", f"Q-LoRA with ZeRO-3 on a {q.upper()} checkpoint: its packed weights "
                     "cannot be partitioned (the worker refuses it; a plain checkpoint, quantized to nf4 on load, "
                     "can be)", Fix("Use ZeRO-2", {"training.zero_stage": 2}))


@rule
def qlora_unquantizable(c: Context) -> Iterable[Advice]:
    if c.t.method != "qlora" or c.spec is None:
        return
    q = c.spec.quant_method
    if q is not None and q not in QLORA_QUANT_METHODS:
        yield Advice("error", "QLORA_UNQUANTIZABLE",
                     f"{c.t.model} is stored as {q}: Q-LoRA trains on GPTQ, AWQ or a bf16 checkpoint it quantizes "
                     "itself, not on this", Fix("Use plain LoRA", {"training.method": "lora"},
                                                hint="or point training.model at the unquantized release"))
    elif q in ("gptq", "awq") and c.cpu:
        yield Advice("error", "QLORA_UNQUANTIZABLE",
                     f"{c.t.model} is {q.upper()}-quantized; its kernels need a CUDA GPU, this run is on CPU",
                     Fix("Use the unquantized model", hint="set training.model to the bf16 release; "
                         "bitsandbytes then quantizes it on CPU"))
    elif q in ("gptq", "awq") and c.t.merge_lora:
        yield Advice("error", "QLORA_MERGE", f"merge_lora cannot merge into a {q.upper()}-quantized base",
                     Fix("Do not merge", {"training.merge_lora": False}))


@rule
def lora_batch_range(c: Context) -> Iterable[Advice]:
    if c.t.method not in ("lora", "qlora"):
        return
    ebs, w, mb = c.preset.effective_batch_size, c.preset.world_size, c.t.per_device_train_batch_size
    if LORA_BATCH_MIN <= ebs <= LORA_BATCH_MAX:
        return
    if ebs < LORA_BATCH_MIN:
        gas = math.ceil(LORA_BATCH_MIN / (mb * w))
        changes = {"training.gradient_accumulation_steps": gas}
    else:
        gas = LORA_BATCH_MAX // (mb * w)
        if gas >= 1:
            changes = {"training.gradient_accumulation_steps": gas}
        else:
            mb = max(1, LORA_BATCH_MAX // w)
            gas = 1
            changes = {"training.per_device_train_batch_size": mb, "training.gradient_accumulation_steps": 1}
    new = mb * gas * w
    fix = Fix(f"Effective batch {new}", changes) if LORA_BATCH_MIN <= new <= LORA_BATCH_MAX else None
    yield Advice("warning", "LORA_BATCH_RANGE",
                 f"effective batch {ebs} ({c.t.per_device_train_batch_size} x {c.t.gradient_accumulation_steps} "
                 f"accumulation x {w} GPUs) is outside {LORA_BATCH_MIN}..{LORA_BATCH_MAX}, the range LoRA "
                 "recipes are tuned for", fix)


# ---------------------------------------------------------------- memory (GPU runs only)

def _memory_rules_apply(c: Context) -> bool:
    return c.spec is not None and not c.cpu and c.gpu_memory_gib is not None


def _oom_fix(c: Context) -> Optional[Fix]:
    """The first single change (in order of least disruption) whose estimate fits."""
    gib, w, t = c.gpu_memory_gib, c.preset.world_size, c.t
    assert c.spec is not None and gib is not None
    ebs = c.preset.effective_batch_size
    mb = max_micro_batch(c.spec, t, w, gib)
    if 1 <= mb < t.per_device_train_batch_size:
        gas = max(1, round(ebs / (mb * w)))
        return Fix(f"Micro-batch {mb} (x{gas} accumulation)", {"training.per_device_train_batch_size": mb,
                                                                "training.gradient_accumulation_steps": gas})
    tries: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    if not t.gradient_checkpointing:
        tries.append(("Gradient checkpointing on", {"training.gradient_checkpointing": True},
                      {"gradient_checkpointing": True}))
    if w > 1 and t.zero_stage != 3 and not (t.method == "qlora" and c.spec.quant_method is not None):
        # Q-LoRA too: ZeRO-3 shards the 4-bit base, a 1/N share of it on each GPU
        tries.append(("Use ZeRO-3" + (" (shards the 4-bit base)" if t.method == "qlora" else ""),
                      {"training.zero_stage": 3}, {"zero_stage": 3}))
    if t.zero_stage is not None and t.offload == "none":
        tries.append(("Offload the optimizer to CPU", {"training.offload": "optimizer"}, {"offload": "optimizer"}))
    if t.method == "full":
        tries.append(("Use LoRA", {"training.method": "lora"}, {"method": "lora"}))
    if t.method == "lora" and t.zero_stage != 3:
        tries.append(("Use Q-LoRA", {"training.method": "qlora"}, {"method": "qlora"}))
    for label, changes, over in tries:
        m = c.memory(**over)
        if m.fits(gib):
            return Fix(f"{label}: ~{_gb(m.total)} per GPU", changes)
    return None


@rule
def oom(c: Context) -> Iterable[Advice]:
    if not _memory_rules_apply(c):
        return
    est, gib = c.memory(), c.gpu_memory_gib
    assert gib is not None and c.spec is not None
    if est.fits(gib):
        if est.total > MEMORY_TIGHT * gib:
            yield Advice("warning", "MEMORY_TIGHT",
                         f"estimated {_gb(est.total)} per GPU, {est.total / gib:.0%} of {_gb(gib)} "
                         f"({c.gpu_memory_where}): little room for longer batches or fragmentation")
        return
    mb = max_micro_batch(c.spec, c.t, c.preset.world_size, gib)
    fit = f"micro-batch {mb} would fit" if mb else "not even micro-batch 1 fits"
    yield Advice("error", "OOM",
                 f"estimated {_gb(est.total)} per GPU > {_gb(gib)} ({c.gpu_memory_where}) at micro-batch "
                 f"{c.t.per_device_train_batch_size} x {c.t.model_max_length} tokens; {fit}", _oom_fix(c))


@rule
def ckpt_unneeded(c: Context) -> Iterable[Advice]:
    if not _memory_rules_apply(c) or not c.t.gradient_checkpointing:
        return
    gib = c.gpu_memory_gib
    assert gib is not None
    on, off = c.memory(), c.memory(gradient_checkpointing=False)
    if off.total > CKPT_OFF_HEADROOM * gib:
        return
    kw = c.step_kwargs()
    s_on = estimate_step(c.spec, c.t, c.nodes, c.gpus_per_node(), c.bandwidth_gbps, **kw)
    s_off = estimate_step(c.spec, c.t, c.nodes, c.gpus_per_node(), c.bandwidth_gbps, gradient_checkpointing=False, **kw)
    yield Advice("info", "CKPT_UNNEEDED",
                 f"gradient checkpointing is on but {_gb(off.total)} of {_gb(gib)} would fit without it "
                 f"(now {_gb(on.total)}); off is ~{s_on.step_time_s / s_off.step_time_s - 1:.0%} faster per step",
                 Fix("Gradient checkpointing off", {"training.gradient_checkpointing": False}))


@rule
def zero_not_needed(c: Context) -> Iterable[Advice]:
    """ZeRO costs speed where nothing needs it: ZeRO-3 gathers every layer's weights in each pass (0.64x plain DDP
    for 7B LoRA on an H200), CPU offload steps the optimizer on the host, ZeRO-2 copies gradients into its
    partitions (0.95x). Where the model states fit every GPU without ZeRO, plain DDP is said only where the
    estimate, network included, has it clearly faster."""
    if not _memory_rules_apply(c) or c.t.zero_stage is None:
        return
    gib = c.gpu_memory_gib
    assert gib is not None and c.spec is not None
    ddp_mem = c.memory(zero_stage=None, offload="none")
    if not ddp_mem.fits(gib) or ddp_mem.total > MEMORY_TIGHT * gib:
        return  # DeepSpeed's partitioning is what makes it fit (or leaves the headroom): keep it
    kw, g = c.step_kwargs(), c.gpus_per_node()
    ds = estimate_step(c.spec, c.t, c.nodes, g, c.bandwidth_gbps, **kw)
    ddp = estimate_step(c.spec, c.t, c.nodes, g, c.bandwidth_gbps, zero_stage=None, offload="none", **kw)
    if ds.step_time_s < DDP_FASTER * ddp.step_time_s:
        return
    changes: dict[str, Any] = {"training.zero_stage": None}
    if c.t.offload != "none":
        changes["training.offload"] = "none"
    yield Advice("warning", "ZERO_NOT_NEEDED",
                 f"ZeRO-{c.t.zero_stage}"
                 + (" with CPU offload" if c.t.offload != "none" else "")
                 + (" gathers every layer's weights in each pass" if c.t.zero_stage >= 3 else
                    " steps the optimizer on the host" if c.t.offload != "none" else " partitions the gradients")
                 + ", "
                 f"yet without ZeRO the model fits each GPU ({_gb(ddp_mem.total)} of {_gb(gib)}): plain DDP is "
                 f"estimated ~{ds.step_time_s / ddp.step_time_s:.1f}x faster per step "
                 f"(~{ddp.tokens_per_second:,.0f} against ~{ds.tokens_per_second:,.0f} tokens/s)",
                 Fix("Plain DDP (no ZeRO)", changes))


# ---------------------------------------------------------------- network and scaling

@rule
def zero3_slow_link(c: Context) -> Iterable[Advice]:
    if c.spec is None or c.t.zero_stage != 3 or c.nodes < 2 or c.bandwidth_gbps is None or c.cpu:
        return
    kw, g = c.step_kwargs(), c.gpus_per_node()
    z3 = estimate_step(c.spec, c.t, c.nodes, g, c.bandwidth_gbps, **kw)
    z2 = estimate_step(c.spec, c.t, c.nodes, g, c.bandwidth_gbps, zero_stage=2, **kw)
    if z3.step_time_s < ZERO3_SLOWER * z2.step_time_s:
        return
    msg = (f"ZeRO-3 across {c.nodes} nodes at {c.bandwidth_gbps:g} Gbit/s: ~{z3.step_time_s:.1f} s/step "
           f"({z3.exposed_comm_s:.1f} s waiting on the network); ZeRO-2 would take ~{z2.step_time_s:.1f} s/step")
    fix: Optional[Fix] = Fix("Use ZeRO-2", {"training.zero_stage": 2})
    if c.gpu_memory_gib is not None:
        m2 = c.memory(zero_stage=2)
        if m2.fits(c.gpu_memory_gib):
            msg += f" and fits ({_gb(m2.total)} of {_gb(c.gpu_memory_gib)})"
        elif c.t.offload == "none" and c.memory(zero_stage=2, offload="optimizer").fits(c.gpu_memory_gib):
            msg += " with the optimizer offloaded to CPU"
            fix = Fix("Use ZeRO-2 with CPU optimizer offload", {"training.zero_stage": 2, "training.offload": "optimizer"})
        else:
            msg += f" but needs {_gb(m2.total)} per GPU, more than {_gb(c.gpu_memory_gib)}"
            fix = None
    yield Advice("warning", "ZERO3_SLOW_LINK", msg, fix)


@rule
def low_bandwidth(c: Context) -> Iterable[Advice]:
    if c.facts is None or c.nodes < 2:
        return
    for i, lk in sorted(c.facts.links.items()):
        bw = lk.bandwidth_gbps
        if bw is None or bw >= LOW_BANDWIDTH_GBPS:
            continue
        nf = c.facts.nodes.get(i)
        fix = Fix("Find a faster interface", hint="pick the node's fastest interface in network.interface, "
                  "or a node on the same switch")
        if nf is not None and nf.ib_devices and c.preset.network.nccl_ib_disable:
            fix = Fix("Let NCCL use InfiniBand", {"network.nccl_ib_disable": False})
        extra = ""
        if c.spec is not None and not c.cpu:
            s = estimate_step(c.spec, c.t, c.nodes, c.gpus_per_node(), bw, **c.step_kwargs())
            extra = f": {s.comm_bytes_per_gpu / 1e9:.2f} GB per GPU per step takes {s.comm_s:.1f} s"
        yield Advice("warning", "LOW_BANDWIDTH",
                     f"node {i} to the master measured {bw:g} Gbit/s, under {LOW_BANDWIDTH_GBPS:g}{extra}", fix, node=i)


@rule
def port_unreachable(c: Context) -> Iterable[Advice]:
    if c.facts is None:
        return
    port = c.preset.network.master_port
    if c.facts.master_port_free is False:
        yield Advice("error", "PORT_IN_USE", f"master port {port} is already in use on node 0",
                     Fix(f"Use port {port + 1}", {"network.master_port": port + 1}), node=0)
    for i, lk in sorted(c.facts.links.items()):
        if lk.port_reachable is False:
            why = f" ({lk.port_error})" if lk.port_error else ""
            yield Advice("error", "PORT_UNREACHABLE",
                         f"node {i} cannot reach {c.preset.master_addr}:{port}{why}; rendezvous would hang "
                         f"{c.preset.network.rdzv_timeout} s and fail",
                         Fix("Open the port", hint=f"allow TCP {port} (and NCCL's ports) into node 0 from node {i}, "
                             "e.g. sudo iptables -I INPUT -p tcp -s <node ip> -j ACCEPT"), node=i)


@rule
def timeouts(c: Context) -> Iterable[Advice]:
    n = c.preset.network
    if n.rdzv_timeout > RDZV_TIMEOUT_MAX_S:
        yield Advice("warning", "RDZV_TIMEOUT_LONG",
                     f"rendezvous timeout {n.rdzv_timeout} s: a node that never starts keeps the others waiting "
                     f"{n.rdzv_timeout / 60:.0f} min before anything fails", Fix("Rendezvous timeout 120 s",
                                                                                   {"network.rdzv_timeout": 120}))
    if n.nccl_timeout > NCCL_TIMEOUT_MAX_S:
        yield Advice("warning", "NCCL_TIMEOUT_LONG",
                     f"NCCL timeout {n.nccl_timeout} s: a hung collective holds every GPU {n.nccl_timeout / 3600:.1f} h "
                     "before the job fails", Fix("NCCL timeout 1800 s", {"network.nccl_timeout": 1800}))
    off = {k: v for k, v in n.env.items()
           if (k in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING") and v.strip() == "0")}
    if off:
        env = {k: v for k, v in n.env.items() if k not in off}
        yield Advice("warning", "TIMEOUT_NONE",
                     f"network.env sets {', '.join(f'{k}={v}' for k, v in off.items())}: a hung collective is never "
                     "aborted, the job hangs instead of failing", Fix("Remove it", {"network.env": env}))


# ---------------------------------------------------------------- cluster consistency (facts)

@rule
def duplicate_host(c: Context) -> Iterable[Advice]:
    nodes = c.preset.cluster.nodes
    seen: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.is_local:
            continue
        if n.host in seen:
            yield Advice("warning", "DUPLICATE_HOST",
                         f"nodes {seen[n.host]} and {i} are both {n.host} (ports {nodes[seen[n.host]].port} and "
                         f"{n.port}): one machine twice unless these are separate containers", node=i)
        else:
            seen[n.host] = i
    names: dict[str, int] = {}
    for i, nf in c.node_facts():
        if nf.hostname is None or i >= len(nodes) or nodes[i].is_local:
            continue
        if nf.hostname in names and nodes[names[nf.hostname]].host != nodes[i].host:
            yield Advice("error", "DUPLICATE_HOST",
                         f"nodes {names[nf.hostname]} ({nodes[names[nf.hostname]].host}) and {i} ({nodes[i].host}) "
                         f"are the same machine ({nf.hostname}): two torchrun agents would claim the same GPUs",
                         Fix(f"Remove node {i}", {"cluster.nodes": [n.model_dump(exclude_unset=True)
                                                                    for j, n in enumerate(nodes) if j != i]}),
                         node=i)
        names.setdefault(nf.hostname, i)


@rule
def gpu_mismatch(c: Context) -> Iterable[Advice]:
    if c.cpu:
        return
    nodes = c.preset.cluster.nodes
    per_machine: dict[str, list[int]] = {}
    for i, nf in c.node_facts():
        if i >= len(nodes) or nf.gpus is None:
            continue
        key = nf.hostname or nodes[i].host
        per_machine.setdefault(key, []).append(i)
    for host, idx in per_machine.items():
        nf = c.facts.nodes[idx[0]] if c.facts else None
        have = nf.gpu_count if nf else None
        want = sum(nodes[i].gpus for i in idx)
        if have is not None and want > have:
            i = idx[-1]
            fix = Fix(f"{max(1, have - want + nodes[i].gpus)} GPUs on node {i}",
                      {f"cluster.nodes.{i}.gpus": have - want + nodes[i].gpus}) if have - want + nodes[i].gpus >= 1 else None
            yield Advice("error", "GPU_COUNT", f"{host} has {have} GPUs but the preset starts {want} processes there",
                         fix, node=i)
    models = {i: nf.gpu_model for i, nf in c.node_facts() if nf.gpus}
    if len(set(models.values())) > 1:
        desc = ", ".join(f"node {i}: {m}" for i, m in models.items())
        yield Advice("warning", "GPU_MISMATCH", f"different GPU models ({desc}): every rank runs at the slowest's pace "
                     "and the smallest memory decides what fits")
    counts = [n.gpus for n in nodes]
    if len(set(counts)) > 1:
        yield Advice("warning", "GPU_MISMATCH",
                     f"GPU counts differ across nodes ({', '.join(map(str, counts))}): ZeRO shards and the data split "
                     "evenly per rank, so the smaller nodes idle or the larger ones wait",
                     Fix(f"{min(counts)} GPUs on every node",
                         {f"cluster.nodes.{i}.gpus": min(counts) for i in range(len(nodes))}))


VERSIONED = ("torch", "transformers", "deepspeed", "peft", "accelerate", "bitsandbytes", "tokenizers")
WIRE = ("torch", "deepspeed")  # a different major.minor may not even agree on collectives


def _needed_packages(c: Context) -> list[str]:
    need = ["torch", "transformers"]
    if c.t.method in ("lora", "qlora"):
        need.append("peft")
    if c.t.zero_stage is not None:
        need.append("deepspeed")
    if c.t.method == "qlora" and (c.spec is None or not c.spec.quantized):
        need.append("bitsandbytes")
    return need


@rule
def version_mismatch(c: Context) -> Iterable[Advice]:
    facts = list(c.node_facts())
    if not facts:
        return
    for pkg in _needed_packages(c):
        missing = [i for i, nf in facts if pkg in nf.versions and nf.versions[pkg] is None]
        if missing:
            yield Advice("error", "PACKAGE_MISSING", f"{pkg} is not installed on node(s) {', '.join(map(str, missing))}",
                         Fix(f"Install {pkg}", hint=f"install it into each node's Python ({pkg} on node {missing[0]})"),
                         node=missing[0])
    for pkg in VERSIONED + ("python",):
        vals = {i: (nf.python_version if pkg == "python" else nf.versions.get(pkg)) for i, nf in facts}
        vals = {i: v for i, v in vals.items() if v}
        if len(set(vals.values())) < 2:
            continue
        mm = {".".join(v.split("+")[0].split(".")[:2]) for v in vals.values()}
        level: Level = "error" if pkg in WIRE and len(mm) > 1 else "warning"
        desc = ", ".join(f"node {i}: {v}" for i, v in vals.items())
        ref = vals.get(0) or next(iter(vals.values()))
        yield Advice(level, "VERSION_MISMATCH", f"{pkg} differs across nodes ({desc})",
                     Fix(f"Install {pkg} {ref} everywhere", hint=f"pip install '{pkg}=={ref}' on the other nodes"
                         if pkg != "python" else "use the same Python on every node (cluster.nodes[].python)"))


# The worker's fast path (with or without DeepSpeed) picks these up by itself where installed (training.fastpath);
# bench/results/train_speed-2026-11-30-H200.md measured what each is worth on an H200.
FAST_KERNELS = {
    "liger-kernel": "Liger's fused loss (without it the worker runs its own chunked loss, slower)",
    "nvidia-cudnn-frontend": "cuDNN's attention (without it FlashAttention 2: a 7B LoRA step 3% slower on an H200)",
}
_HOPPER_OR_NEWER = re.compile(r"\b(G?H\d{2,3}|G?B\d{3})\b")  # H100, H200, H800, H20, GH200, B200, GB200


@rule
def fast_kernel_missing(c: Context) -> Iterable[Advice]:
    if c.cpu:
        return
    for pkg, what in FAST_KERNELS.items():
        gpu_nodes = [(i, nf) for i, nf in c.node_facts() if nf.gpus and pkg in nf.versions
                     and (pkg != "nvidia-cudnn-frontend" or _HOPPER_OR_NEWER.search(nf.gpu_model or ""))]
        lacking = [i for i, nf in gpu_nodes if nf.versions[pkg] is None]
        if not lacking:
            continue
        mixed = len(lacking) < len(gpu_nodes)
        msg = f"{pkg} is not installed on node(s) {', '.join(map(str, lacking))}: no {what}"
        if mixed:
            msg += "; the other nodes have it, and every step waits for the slowest rank"
        yield Advice("warning" if mixed else "info", "FAST_KERNEL_MISSING", msg,
                     Fix(f"Install {pkg}", hint=f"pip install {pkg} (or qwen-tui's [gpu] extra) into the Python of "
                         f"node {lacking[0]}"), node=lacking[0])


def _file_rules(c: Context, what: str) -> Iterable[Advice]:
    path = getattr(c.t, "data" if what == "data" else "model")
    if path.startswith("builtin:"):
        return
    got = {i: getattr(nf, what) for i, nf in c.node_facts() if getattr(nf, what) is not None}
    code = what.upper()
    for i, ff in got.items():
        if not ff.exists:
            yield Advice("error", f"{code}_MISSING", f"{path} is missing on node {i}",
                         Fix(f"Copy the {what} to node {i}", hint=f"rsync it to the same path on node {i}, or put it "
                             "on shared storage"), node=i)
    sums = {i: ff.sha256 for i, ff in got.items() if ff.exists and ff.sha256}
    sizes = {i: ff.size_bytes for i, ff in got.items() if ff.exists}
    differ = len(set(sums.values())) > 1 or (not sums and len(set(sizes.values())) > 1)
    if differ:
        ref = 0 if 0 in got else min(got)
        odd = [i for i in got if i != ref and ((sums.get(i) and sums.get(i) != sums.get(ref))
                                               or sizes.get(i) != sizes.get(ref))]
        yield Advice("error" if what == "data" else "warning", f"{code}_DIFFERS",
                     f"{path} differs between node {ref} and node(s) {', '.join(map(str, odd))} "
                     f"({sizes.get(ref, 0):,} vs {sizes.get(odd[0], 0) if odd else 0:,} bytes)",
                     Fix(f"Copy node {ref}'s {what}", hint=f"rsync node {ref}'s copy over the others"),
                     node=odd[0] if odd else None)


@rule
def data_files(c: Context) -> Iterable[Advice]:
    yield from _file_rules(c, "data")


@rule
def model_files(c: Context) -> Iterable[Advice]:
    if c.spec is not None and "/" in c.t.model and not c.t.model.startswith((".", "/", "~")):
        # a hub id: nodes without a local copy download it, so absence is not an error
        got = [nf.model for _, nf in c.node_facts() if nf.model is not None and nf.model.exists]
        if not got:
            return
    yield from _file_rules(c, "model")


@rule
def no_shared_storage(c: Context) -> Iterable[Advice]:
    if c.facts is None or c.nodes < 2 or c.t.save_strategy == "no":
        return
    if all(n.is_local for n in c.preset.cluster.nodes):
        return
    if c.preset.cluster.shared_storage and c.facts.shared_storage is False:
        yield Advice("warning", "NO_SHARED_STORAGE",
                     f"cluster.shared_storage is true but {c.t.output_dir} is not one filesystem on every node: "
                     "checkpoints would be saved by rank 0 only, and each node's ZeRO shards land on its own disk",
                     Fix("Save on every node", {"cluster.shared_storage": False}))
    if not c.preset.cluster.shared_storage and c.facts.shared_storage is True:
        yield Advice("error", "SHARED_STORAGE_UNDECLARED",
                     f"{c.t.output_dir} is one filesystem on every node but cluster.shared_storage is false: "
                     "every node would write the same checkpoint files at once",
                     Fix("Declare shared storage", {"cluster.shared_storage": True}))


# ---------------------------------------------------------------- entry point

def advise(preset: Preset, facts: Optional[ClusterFacts] = None, **kwargs: Any) -> list[Advice]:
    """Every rule's advice, errors first. kwargs go to make_context (spec, gpu, gpu_memory_gib, bandwidth_gbps,
    efficiency, base_dir)."""
    c = make_context(preset, facts, **kwargs)
    out: list[Advice] = []
    for r in RULES:
        out.extend(r(c))
    return sorted(out, key=lambda a: LEVEL_ORDER[a.level])
