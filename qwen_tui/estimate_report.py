"""The estimate as one report of plain data: memory per GPU, step time, tokens/s, scaling and the
advice, for a preset and what the checks learned. `qwen-tui estimate --json` prints it; the wizard's
Training step shows `summary()` of it. (It lives beside estimate.py, which holds the formulas.)"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from .advice import CKPT_OFF_HEADROOM, advise, make_context
from .estimate import RunShape, effective_efficiency, estimate_memory, estimate_step, max_micro_batch, scaling
from .facts import ClusterFacts
from .longcontext import is_long, longest_record, row_memory
from .preset import Preset


def _r(x: Optional[float], n: int = 3) -> Optional[float]:
    return None if x is None else round(x, n)


def build_report(preset, facts: Optional[ClusterFacts], *, gpu: Optional[str] = None,
                 gpu_memory_gib: Optional[float] = None, bandwidth_gbps: Optional[float] = None,
                 efficiency: Optional[float] = None, max_nodes: Optional[int] = None,
                 base_dir: Optional[str] = None) -> dict[str, Any]:
    """The estimate as plain data (what --json prints)."""
    c = make_context(preset, facts, gpu=gpu, gpu_memory_gib=gpu_memory_gib, bandwidth_gbps=bandwidth_gbps,
                     efficiency=efficiency, base_dir=base_dir)
    advice = advise(preset, facts, spec=c.spec, gpu=c.gpu, gpu_memory_gib=c.gpu_memory_gib,
                    bandwidth_gbps=c.bandwidth_gbps, efficiency=efficiency, base_dir=base_dir)
    t, w = preset.training, preset.world_size
    report: dict[str, Any] = {
        "model": None, "error": None,
        "gpu": {"name": c.gpu.name if c.gpu else None, "memory_gib": _r(c.gpu_memory_gib),
                "source": c.gpu_memory_where or None},
        "world_size": w, "nodes": len(preset.cluster.nodes), "bandwidth_gbps": c.bandwidth_gbps, "cpu": c.cpu,
        "link_measured": c.bandwidth_gbps is not None,
        "efficiency": None if c.cpu else _r(effective_efficiency(RunShape.of(t), efficiency)),
        "gpu_memory_gb": None, "step_time_s": None, "tokens_per_second": None, "tokens_per_step": None,
        "step": None, "scaling_efficiency": [],
        "recommended": {"micro_batch": None, "gradient_checkpointing": None},
        "long_context": None,
        "advice": [a.to_dict() for a in advice],
    }
    if c.spec is None:
        report["error"] = c.spec_error
        return report
    spec = c.spec
    report["model"] = {"name": t.model, "params": spec.total_params,
                       "trainable_params": spec.total_params if t.method == "full"
                       else spec.lora_params(t.lora_r, t.lora_target_modules)}
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
    g = max(n.gpus for n in preset.cluster.nodes)
    kw = c.step_kwargs()
    n_max = max_nodes or max(4, len(preset.cluster.nodes))
    points = scaling(spec, t, n_max, g, c.bandwidth_gbps, **kw)
    step = estimate_step(spec, t, len(preset.cluster.nodes), g, c.bandwidth_gbps, **kw)
    report["step"] = {k: (_r(v, 4) if isinstance(v, float) else v) for k, v in step.to_dict().items()}
    report["step_time_s"] = _r(step.step_time_s)
    report["tokens_per_second"] = round(step.tokens_per_second, 1)
    report["tokens_per_step"] = step.tokens_per_step
    report["scaling_efficiency"] = [{k: (_r(v) if isinstance(v, float) else v) for k, v in p.to_dict().items()}
                                    for p in points]
    if c.bandwidth_gbps is None:
        # Unmeasured, the model takes the link as fast as inside a node: "100 % of linear" would be a guess
        # dressed as a result. One node needs no link, so its point stays.
        for p in report["scaling_efficiency"]:
            if p["nodes"] > 1:
                p["scaling_efficiency"] = p["efficiency_no_overlap"] = None
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
    memory_gib: Optional[float] = None
    smallest_gpu_gib: Optional[float] = None
    memory_note: str = ""
    step_seconds: Optional[float] = None
    tokens_per_s: Optional[float] = None
    scaling: Optional[float] = None
    cpu: bool = False  # CPU processes (device cpu, or a probe found no GPUs): no GPU figures apply
    link_measured: bool = True
    notes: list[str] = field(default_factory=list)


def summary(preset: Preset, facts: ClusterFacts, base_dir: Optional[str] = None,
            gpu: Optional[str] = None) -> Summary:
    """build_report's figures for this cluster size (the same numbers `qwen-tui estimate --json` prints).
    gpu: the GPU type to assume where no probe says (the CLI's --gpu)."""
    est = Summary(effective_batch=preset.effective_batch_size, batch_formula=preset.batch_formula)
    r = build_report(preset, facts, gpu=gpu, base_dir=base_dir or os.getcwd())
    est.smallest_gpu_gib = (r.get("gpu") or {}).get("memory_gib")
    est.cpu, est.link_measured = bool(r.get("cpu")), bool(r.get("link_measured", True))
    if r.get("error"):
        est.notes.append(str(r["error"]))
        return est
    mem = r.get("gpu_memory_gb") or {}
    est.memory_gib = mem.get("total")
    est.memory_note = str(mem.get("phase") or "")
    lc = r.get("long_context") or {}
    if lc.get("long_rows"):  # the worker's long-row path, not the stock estimate (qwen_tui.longcontext)
        est.memory_gib, est.memory_note = lc["row_memory_gib"], "one long row"
    est.step_seconds = r.get("step_time_s")
    est.tokens_per_s = r.get("tokens_per_second")
    here = next((p for p in r.get("scaling_efficiency") or [] if p.get("nodes") == len(preset.cluster.nodes)), None)
    if here is not None:
        est.scaling = here.get("scaling_efficiency")
    if preset.training.device == "cpu":
        est.notes.append("device cpu: GPU memory and speed figures do not apply")
    return est
