"""The estimate as one report of plain data: memory per GPU, step time, tokens/s, scaling and the
advice, for a preset and what the checks learned. `qwen-tui estimate --json` prints it; the wizard's
Training step shows `summary()` of it. (The formulas are in qwen_tui/plan/estimate.py.)"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..cluster.facts import ClusterFacts
from ..plan.estimate import RunShape, estimate_memory, max_micro_batch
from ..plan.estimate_comm import MEASURE_HINT
from ..plan.estimate_time import effective_efficiency, nodes_worth_it, scaling
from ..plan.longcontext import is_long, longest_record, row_memory
from ..preset.schema import Preset
from .rules import CKPT_OFF_HEADROOM, advise, make_context

NODES_WORTH_LIMIT = 64  # "how many nodes are worth it" is searched up to this many


def _r(x: float | None, n: int = 3) -> float | None:
    return None if x is None else round(x, n)


def build_report(preset, facts: ClusterFacts | None, *, gpu: str | None = None,
                 gpu_memory_gib: float | None = None, bandwidth_gbps: float | None = None,
                 efficiency: float | None = None, max_nodes: int | None = None,
                 base_dir: str | None = None, nic_gbps: float | None = None, nics: int | None = None,
                 intra_node_gbs: float | None = None) -> dict[str, Any]:
    """The estimate as plain data (what --json prints). bandwidth_gbps: per-node bus bandwidth between nodes;
    nic_gbps x nics: the NICs NCCL uses; intra_node_gbs: bus bandwidth inside a node, GB/s (topology facts)."""
    c = make_context(preset, facts, gpu=gpu, gpu_memory_gib=gpu_memory_gib, bandwidth_gbps=bandwidth_gbps,
                     efficiency=efficiency, base_dir=base_dir, nic_gbps=nic_gbps, nics=nics,
                     intra_node_gbs=intra_node_gbs)
    advice = advise(preset, facts, spec=c.spec, gpu=c.gpu, gpu_memory_gib=c.gpu_memory_gib,
                    bandwidth_gbps=bandwidth_gbps, efficiency=efficiency, base_dir=base_dir, nic_gbps=nic_gbps,
                    nics=nics, intra_node_gbs=intra_node_gbs)
    t, w = preset.training, preset.world_size
    nodes = len(preset.cluster.nodes)
    unknown = []
    if not c.cpu and c.gpu is None:
        unknown.append("GPU type unknown: pass --gpu, or --facts from `qwen-tui check`")
    if not c.cpu and nodes > 1 and not c.bandwidth.known:
        unknown.append("link between nodes not measured: " + MEASURE_HINT)
    report: dict[str, Any] = {
        "model": None, "error": None,
        "gpu": {"name": c.gpu.name if c.gpu else None, "memory_gib": _r(c.gpu_memory_gib),
                "source": c.gpu_memory_where or None},
        "world_size": w, "nodes": nodes, "bandwidth_gbps": _r(c.bandwidth_gbps), "cpu": c.cpu,
        "link_measured": c.bandwidth.known,
        "bandwidth": c.bandwidth.to_dict(),
        "speed_unknown": unknown,
        "efficiency": None if c.cpu else _r(effective_efficiency(RunShape.of(t), efficiency, c.spec)),
        "gpu_memory_gb": None, "step_time_s": None, "tokens_per_second": None, "tokens_per_step": None,
        "step": None, "scaling_efficiency": [], "nodes_worth_it": None,
        "recommended": {"micro_batch": None, "gradient_checkpointing": None},
        "long_context": None,
        "advice": [a.to_dict() for a in advice],
    }
    if c.spec is None:
        report["error"] = c.spec_error
        return report
    spec = c.spec
    report["model"] = {"name": t.model, "params": spec.total_params, "active_params": spec.active_params,
                       "trainable_params": spec.total_params if t.method == "full"
                       else spec.lora_params(t.lora_r, t.lora_target_modules),
                       "moe": {"experts": spec.experts, "experts_per_token": spec.experts_per_token,
                               "moe_intermediate_size": spec.moe_intermediate,
                               "shared_expert_intermediate_size": spec.shared_intermediate,
                               "moe_layers": spec.moe_layers} if spec.is_moe else None}
    mem = estimate_memory(spec, t, w)
    report["gpu_memory_gb"] = {**mem.to_dict(), "fits": mem.fits(c.gpu_memory_gib) if c.gpu_memory_gib else None}
    if not c.cpu:
        row = row_memory(spec, t, w, t.model_max_length)
        report["long_context"] = {
            "long_rows": is_long(t), "sequence_parallel_size": t.sequence_parallel_size,
            "row_memory_gib": _r(row.total), "tiled_mlp": row.tiled,
            "longest_record": longest_record(spec, t, w, c.gpu_memory_gib) if c.gpu_memory_gib else None}
    if c.cpu:
        # The step-time model is one of GPU FLOPs and links: for CPU processes its figures would be fiction.
        return report
    g = c.gpus_per_node()
    kw = c.step_kwargs()
    report["tokens_per_step"] = t.per_device_train_batch_size * t.model_max_length * t.gradient_accumulation_steps * w
    if c.gpu is not None:
        # Speed needs the GPU's FLOPs; past one node, the link too. Unknown stays unknown (speed_unknown says how
        # to learn it): an H100 or NVLink taken for granted would print a firm figure nobody measured.
        n_max = max_nodes or max(4, nodes)
        points = scaling(spec, t, n_max, g, c.bandwidth_gbps, **kw)
        report["scaling_efficiency"] = [{k: (_r(v) if isinstance(v, float) else v) for k, v in p.to_dict().items()}
                                        for p in points]
        if not c.bandwidth.known:
            for p in report["scaling_efficiency"]:
                if p["nodes"] > 1:
                    for k in ("step_time_s", "tokens_per_second", "scaling_efficiency", "step_time_no_overlap_s",
                              "efficiency_no_overlap"):
                        p[k] = None
        else:
            report["nodes_worth_it"] = nodes_worth_it(spec, t, g, c.bandwidth_gbps, limit=NODES_WORTH_LIMIT, **kw)
    if c.speed_known:
        step = c.step_here()
        report["step"] = {k: (_r(v, 4) if isinstance(v, float) else v) for k, v in step.to_dict().items()}
        report["step_time_s"] = _r(step.step_time_s)
        report["tokens_per_second"] = round(step.tokens_per_second, 1)
        report["tokens_per_step"] = step.tokens_per_step
    if c.gpu_memory_gib and not c.cpu:
        off = estimate_memory(spec, t, w, gradient_checkpointing=False)
        ckpt = not off.total <= CKPT_OFF_HEADROOM * c.gpu_memory_gib
        report["recommended"] = {
            "micro_batch": max_micro_batch(spec, t, w, c.gpu_memory_gib, gradient_checkpointing=ckpt) or None,
            "gradient_checkpointing": ckpt,
        }
    return report


@dataclass
class Summary:
    """The Training step's live numbers; None where the estimator could not say."""

    effective_batch: int = 0
    batch_formula: str = ""
    memory_gib: float | None = None
    smallest_gpu_gib: float | None = None
    memory_note: str = ""
    step_seconds: float | None = None
    tokens_per_s: float | None = None
    scaling: float | None = None
    cpu: bool = False  # CPU processes (device cpu, or a probe found no GPUs): no GPU figures apply
    link_measured: bool = True
    bandwidth_gbps: float | None = None  # between nodes (per-node bus bandwidth)
    bandwidth_source: str = ""  # where it came from: given, rehearsal, nics, ib-ports, iperf3, unknown
    bandwidth_lower_bound: bool = False
    nodes_worth_it: int | None = None
    model: str = ""  # parameters (a mixture of experts: total, active and experts)
    notes: list[str] = field(default_factory=list)


def human_count(n: float) -> str:
    """A parameter count in the unit that shows it: '7.62 B', '1.3 M' (a tiny test model is not '0.00 B')."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "B" else f"{n / scale:.1f} {unit}"
    return f"{n:.0f}"


def model_line(m: dict) -> str:
    """'30.53 B parameters, 3.35 B active a token (8 of 128 experts)' from a report's model entry."""
    line = f"{human_count(m['params'])} parameters"
    if m.get("moe"):
        moe = m["moe"]
        shared = ", + a shared expert" if moe.get("shared_expert_intermediate_size") else ""
        line += (f", {human_count(m['active_params'])} active a token ({moe['experts_per_token']} of "
                 f"{moe['experts']} experts{shared})")
    return line


def summary(preset: Preset, facts: ClusterFacts, base_dir: str | None = None,
            gpu: str | None = None, intra_node_gbs: float | None = None) -> Summary:
    """build_report's figures for this cluster size (the same numbers `qwen-tui estimate --json` prints).
    gpu: the GPU type to assume where no probe says (the CLI's --gpu); intra_node_gbs: NCCL bus bandwidth inside
    a node, GB/s, where the nodes' topology says (default: the GPU type's)."""
    est = Summary(effective_batch=preset.effective_batch_size, batch_formula=preset.batch_formula)
    r = build_report(preset, facts, gpu=gpu, base_dir=base_dir or os.getcwd(), intra_node_gbs=intra_node_gbs)
    est.smallest_gpu_gib = (r.get("gpu") or {}).get("memory_gib")
    est.cpu, est.link_measured = bool(r.get("cpu")), bool(r.get("link_measured", True))
    bw = r.get("bandwidth") or {}
    est.bandwidth_gbps, est.bandwidth_source = bw.get("gbps"), str(bw.get("source") or "")
    est.bandwidth_lower_bound = bool(bw.get("lower_bound"))
    est.nodes_worth_it = r.get("nodes_worth_it")
    if r.get("error"):
        est.notes.append(str(r["error"]))
        return est
    est.model = model_line(r["model"])
    mem = r.get("gpu_memory_gb") or {}
    est.memory_gib = mem.get("total")
    est.memory_note = str(mem.get("phase") or "")
    lc = r.get("long_context") or {}
    if lc.get("long_rows"):  # the worker's long-row path, not the stock estimate (qwen_tui.plan.longcontext)
        est.memory_gib, est.memory_note = lc["row_memory_gib"], "one long row"
    est.step_seconds = r.get("step_time_s")
    est.tokens_per_s = r.get("tokens_per_second")
    here = next((p for p in r.get("scaling_efficiency") or [] if p.get("nodes") == len(preset.cluster.nodes)), None)
    if here is not None:
        est.scaling = here.get("scaling_efficiency")
    if preset.training.device == "cpu":
        est.notes.append("device cpu: GPU memory and speed figures do not apply")
    else:  # the wizard's own ways to learn what the speed needs (the CLI's are in the report)
        if not r.get("cpu") and (r.get("gpu") or {}).get("name") is None:
            est.notes.append("speed unknown: pick a GPU type, or probe the nodes")
        elif len(preset.cluster.nodes) > 1 and not est.link_measured:
            est.notes.append("speed across nodes unknown: measure the link between them (Network, F3)")
    return est
