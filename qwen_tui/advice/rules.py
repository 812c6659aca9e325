"""The rules behind the live warnings: plain functions over (preset, facts).

`advise(preset, facts)` runs every rule in RULES and returns a list of Advice,
errors first. Each rule is a small function that yields zero or more Advice; each
Advice has a stable `code` (listed in advice/codes.py, which the manual renders), a
level, a one-line message with the numbers that triggered it, and where one preset
change can fix it, a `Fix`. Nothing here changes a preset: `apply_fix` returns a new, validated
one, and only when the user accepts it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..base.levels import Level, loudest_first
from ..cluster.facts import ClusterFacts
from ..plan.estimate import estimate_memory, host_memory_gib, max_micro_batch
from ..plan.estimate_time import estimate_step, nodes_worth_it
from ..plan.longcontext import is_long
from ..preset.schema import Preset
from .core import (  # noqa: F401 - the names users of the advice import from here
    CKPT_OFF_HEADROOM,
    DDP_FASTER,
    LORA_BATCH_MAX,
    LORA_BATCH_MIN,
    LOW_BANDWIDTH_GBPS,
    MEMORY_TIGHT,
    NCCL_TIMEOUT_MAX_S,
    QLORA_QUANT_METHODS,
    RDZV_TIMEOUT_MAX_S,
    RULES,
    ZERO3_SLOWER,
    Advice,
    Context,
    Fix,
    Rule,
    _gb,
    apply_fix,
    make_context,
    rule,
)

HOST_MEMORY_USE = 0.85  # of a node's RAM: past this an offloading run is warned about

# ---------------------------------------------------------------- model and method

@rule
def model_unknown(c: Context) -> Iterable[Advice]:
    if c.spec is None:
        yield Advice(Level.INFO, "MODEL_UNKNOWN", f"no memory or speed estimate: {c.spec_error}")


@rule
def int4_needs_qlora(c: Context) -> Iterable[Advice]:
    if c.spec is None or not c.spec.quantized or c.t.method == "qlora":
        return
    changes: dict[str, Any] = {"training.method": "qlora"}
    if c.t.zero_stage == 3:
        changes["training.zero_stage"] = 2
    yield Advice(Level.ERROR, "INT4_NEEDS_QLORA",
                 f"{c.t.model} is {c.spec.quant_method}-quantized ({c.spec.quant_bits or '?'}-bit): "
                 f"{c.t.method} fine-tuning cannot train it, only Q-LoRA can",
                 Fix("Use Q-LoRA", changes))


@rule
def qlora_full(c: Context) -> Iterable[Advice]:
    flags = {"--q_lora", "--load_in_4bit", "--load_in_8bit"}
    asked = [a for a in c.t.extra_args if a in flags]
    if c.t.method == "full" and asked:
        rest = [a for a in c.t.extra_args if a not in flags]
        yield Advice(Level.ERROR, "QLORA_FULL",
                     f"extra_args ask for {', '.join(asked)} with method full: quantized weights cannot be fully "
                     "fine-tuned",
                     Fix("Use Q-LoRA", {"training.method": "qlora", "training.extra_args": rest}))


@rule
def qlora_zero3(c: Context) -> Iterable[Advice]:
    """ZeRO-3 shards a base the worker quantizes to nf4 itself (stored in bf16, which DeepSpeed partitions); a
    GPTQ/AWQ checkpoint's packed integer weights it cannot."""
    q = c.spec.quant_method if c.spec is not None else None
    if c.t.method == "qlora" and c.t.zero_stage == 3 and q is not None:
        yield Advice(Level.ERROR, "QLORA_ZERO3", f"Q-LoRA with ZeRO-3 on a {q.upper()} checkpoint: its packed weights "
                     "cannot be partitioned (the worker refuses it; a plain checkpoint, quantized to nf4 on load, "
                     "can be)", Fix("Use ZeRO-2", {"training.zero_stage": 2}))


@rule
def qlora_unquantizable(c: Context) -> Iterable[Advice]:
    if c.t.method != "qlora" or c.spec is None:
        return
    q = c.spec.quant_method
    if q is not None and q not in QLORA_QUANT_METHODS:
        yield Advice(Level.ERROR, "QLORA_UNQUANTIZABLE",
                     f"{c.t.model} is stored as {q}: Q-LoRA trains on GPTQ, AWQ or a bf16 checkpoint it quantizes "
                     "itself, not on this", Fix("Use plain LoRA", {"training.method": "lora"},
                                                hint="or point training.model at the unquantized release"))
    elif q in ("gptq", "awq") and c.cpu:
        yield Advice(Level.ERROR, "QLORA_UNQUANTIZABLE",
                     f"{c.t.model} is {q.upper()}-quantized; its kernels need a CUDA GPU, this run is on CPU",
                     Fix("Use the unquantized model", hint="set training.model to the bf16 release; "
                         "bitsandbytes then quantizes it on CPU"))
    elif q in ("gptq", "awq") and c.t.merge_lora:
        yield Advice(Level.ERROR, "QLORA_MERGE", f"merge_lora cannot merge into a {q.upper()}-quantized base",
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
    yield Advice(Level.WARNING, "LORA_BATCH_RANGE",
                 f"effective batch {ebs} ({c.t.per_device_train_batch_size} x {c.t.gradient_accumulation_steps} "
                 f"accumulation x {w} GPUs) is outside {LORA_BATCH_MIN}..{LORA_BATCH_MAX}, the range LoRA "
                 "recipes are tuned for", fix)


# ---------------------------------------------------------------- memory (GPU runs only)

def _memory_rules_apply(c: Context) -> bool:
    # Long rows are the long-row rules' (advice/longcontext.py): the worker runs them on another path than estimated here
    return c.spec is not None and not c.cpu and c.gpu_memory_gib is not None and not is_long(c.t)


def _oom_fix(c: Context) -> Fix | None:
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
    if t.zero_stage is not None and t.offload == "none" and _host_fits(c, offload="optimizer") is not False:
        host = host_memory_gib(c.spec, t, c.nodes, c.gpus_per_node(), offload="optimizer")
        tries.append((f"Offload the optimizer to CPU (~{host:,.0f} GiB of host memory a node)",
                      {"training.offload": "optimizer"}, {"offload": "optimizer"}))
    if t.method == "full":
        tries.append(("Use LoRA", {"training.method": "lora"}, {"method": "lora"}))
    if t.method == "lora" and t.zero_stage != 3:
        tries.append(("Use Q-LoRA", {"training.method": "qlora"}, {"method": "qlora"}))
    for label, changes, over in tries:
        m = c.memory(**over)
        if m.fits(gib):
            return Fix(f"{label}: ~{_gb(m.total)} per GPU", changes)
    return None


def _fits_on(c: Context, nodes: int) -> bool:
    """Whether this run fits on its first `nodes` nodes: each GPU's memory (where the GPU is known) and, with offload,
    each host's (where the probe read it)."""
    g = c.gpus_per_node()
    assert c.spec is not None
    if c.gpu_memory_gib is not None and not estimate_memory(c.spec, c.t, nodes * g).fits(c.gpu_memory_gib):
        return False
    have = _host_gib(c)
    return have is None or host_memory_gib(c.spec, c.t, nodes, g) <= HOST_MEMORY_USE * have[0]


def _host_gib(c: Context) -> tuple[float, int] | None:
    """The smallest host memory the probe found on a node (GiB) and that node; None when no node was probed."""
    got = [(nf.memory_total_mib / 1024, i) for i, nf in c.node_facts() if nf.memory_total_mib]
    return min(got) if got else None


def _host_fits(c: Context, **overrides: Any) -> bool | None:
    """Whether the nodes' host memory holds what the run (with overrides) puts there; None when not probed."""
    have = _host_gib(c)
    if have is None or c.spec is None:
        return None
    return host_memory_gib(c.spec, c.t, c.nodes, c.gpus_per_node(), **overrides) <= HOST_MEMORY_USE * have[0]


@rule
def offload_host_memory(c: Context) -> Iterable[Advice]:
    """ZeRO offload keeps the optimizer's fp32 states in the nodes' RAM: said with the figure, against what the probe
    read on every node (an error when it does not fit, a warning when it barely does)."""
    if c.spec is None or c.t.zero_stage is None or c.t.offload == "none" or c.cpu:
        return
    need = host_memory_gib(c.spec, c.t, c.nodes, c.gpus_per_node())
    have = _host_gib(c)
    what = (f"offload ({c.t.offload}) keeps ~{need:,.0f} GiB on each node's host (the optimizer's fp32 states of "
            f"{c.nodes} node(s), DeepSpeed's buffers, {c.gpus_per_node()} rank(s)' processes)")
    fix = None
    if c.gpu_memory_gib is not None and c.memory(offload="none").fits(c.gpu_memory_gib):
        fix = Fix("No offload: the GPUs hold it", {"training.offload": "none"})
    if have is None:
        yield Advice(Level.INFO, "OFFLOAD_HOST_MEMORY", f"{what}; the nodes' memory was not probed "
                     "(qwen-tui check reads it)", fix)
    elif need > have[0]:
        yield Advice(Level.ERROR, "OFFLOAD_HOST_MEMORY", f"{what}, more than node {have[1]}'s {have[0]:,.0f} GiB",
                     fix or Fix("More nodes, or a smaller run", hint="each node added shares the optimizer states; "
                                "or use LoRA"), node=have[1])
    elif need > HOST_MEMORY_USE * have[0]:
        yield Advice(Level.WARNING, "OFFLOAD_HOST_MEMORY", f"{what}: {need / have[0]:.0%} of node {have[1]}'s "
                     f"{have[0]:,.0f} GiB, little left for the page cache and the data", fix, node=have[1])


@rule
def oom(c: Context) -> Iterable[Advice]:
    if not _memory_rules_apply(c):
        return
    est, gib = c.memory(), c.gpu_memory_gib
    assert gib is not None and c.spec is not None
    if est.fits(gib):
        if est.total > MEMORY_TIGHT * gib:
            yield Advice(Level.WARNING, "MEMORY_TIGHT",
                         f"estimated {_gb(est.total)} per GPU, {est.total / gib:.0%} of {_gb(gib)} "
                         f"({c.gpu_memory_where}): little room for longer batches or fragmentation")
        return
    mb = max_micro_batch(c.spec, c.t, c.preset.world_size, gib)
    fit = f"micro-batch {mb} would fit" if mb else "not even micro-batch 1 fits"
    yield Advice(Level.ERROR, "OOM",
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
    s_on, s_off = c.step_here(), c.step_here(gradient_checkpointing=False)
    yield Advice(Level.INFO, "CKPT_UNNEEDED",
                 f"gradient checkpointing is on but {_gb(off.total)} of {_gb(gib)} would fit without it "
                 f"(now {_gb(on.total)}); off is ~{s_on.step_time_s / s_off.step_time_s - 1:.0%} faster per step",
                 Fix("Gradient checkpointing off", {"training.gradient_checkpointing": False}))


@rule
def zero_not_needed(c: Context) -> Iterable[Advice]:
    """ZeRO costs speed where nothing needs it: ZeRO-3 gathers every layer's weights in each pass (over the network
    between nodes; 0.95x plain DDP for 7B LoRA on one H200), CPU offload steps the optimizer on the host, ZeRO-2
    copies gradients into its partitions (0.98x). Where the model states fit every GPU without ZeRO, plain DDP is said only where the
    estimate, network included, has it clearly faster."""
    if not _memory_rules_apply(c) or c.t.zero_stage is None or not c.speed_known:
        return  # with the link between nodes or the GPU unknown, "faster" would be a guess
    gib = c.gpu_memory_gib
    assert gib is not None and c.spec is not None
    ddp_mem = c.memory(zero_stage=None, offload="none")
    if not ddp_mem.fits(gib) or ddp_mem.total > MEMORY_TIGHT * gib:
        return  # DeepSpeed's partitioning is what makes it fit (or leaves the headroom): keep it
    ds, ddp = c.step_here(), c.step_here(zero_stage=None, offload="none")
    if ds.step_time_s < DDP_FASTER * ddp.step_time_s:
        return
    changes: dict[str, Any] = {"training.zero_stage": None}
    if c.t.offload != "none":
        changes["training.offload"] = "none"
    yield Advice(Level.WARNING, "ZERO_NOT_NEEDED",
                 f"ZeRO-{c.t.zero_stage}"
                 + (" with CPU offload" if c.t.offload != "none" else "")
                 + (" gathers every layer's weights in each pass" if c.t.zero_stage >= 3 else
                    " steps the optimizer on the host" if c.t.offload != "none" else " partitions the gradients")
                 + ", "
                 f"yet without ZeRO the model fits each GPU ({_gb(ddp_mem.total)} of {_gb(gib)}): plain DDP is "
                 f"estimated ~{ds.step_time_s / ddp.step_time_s:.1f}x faster per step "
                 f"(~{ddp.tokens_per_second:,.0f} against ~{ds.tokens_per_second:,.0f} tokens/s"
                 + (f"; {c.bandwidth_gbps:.3g} Gbit/s between nodes, {c.bandwidth.source}" if c.nodes > 1 else "")
                 + ")"
                 + (f"; without DeepSpeed FP8's auto runs the matmuls in FP8 ({ddp.fp8_speedup:.2f}x measured "
                    "through the worker), under it they stay bf16" if ddp.fp8 and not ds.fp8 else ""),
                 Fix("Plain DDP (no ZeRO)", changes))


# ---------------------------------------------------------------- network and scaling

def _secs(x: float) -> str:
    """A duration readable from a tiny model's milliseconds to a large one's seconds."""
    return f"{x * 1000:.3g} ms" if x < 1 else f"{x:.1f} s"


@rule
def zero3_slow_link(c: Context) -> Iterable[Advice]:
    if c.spec is None or c.t.zero_stage != 3 or c.nodes < 2 or not c.bandwidth.known or c.cpu:
        return
    z3, z2 = c.step_here(), c.step_here(zero_stage=2)
    if z3.step_time_s < ZERO3_SLOWER * z2.step_time_s:
        return
    gpu = c.gpu.name if c.gpu else "GPUs of unknown type, figured as H100s"
    msg = (f"ZeRO-3 across {c.nodes} nodes at {c.bandwidth_gbps:.3g} Gbit/s ({c.bandwidth.source}), {gpu}: "
           f"~{_secs(z3.step_time_s)}/step ({_secs(z3.exposed_comm_s)} waiting on the network); ZeRO-2 would take "
           f"~{_secs(z2.step_time_s)}/step")
    fix: Fix | None = Fix("Use ZeRO-2", {"training.zero_stage": 2})
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
    yield Advice(Level.WARNING, "ZERO3_SLOW_LINK", msg, fix)


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
            s = estimate_step(c.spec, c.t, c.nodes, c.gpus_per_node(), bw, world_size=c.preset.world_size,
                              **c.step_kwargs())
            b = s.comm_bytes_per_gpu
            size = f"{b / 1e9:.3g} GB" if b >= 1e9 else f"{b / 1e6:.3g} MB"
            extra = f": {size} per GPU per step takes {_secs(s.comm_s)}"
        yield Advice(Level.WARNING, "LOW_BANDWIDTH",
                     f"node {i} to the master measured {bw:g} Gbit/s, under {LOW_BANDWIDTH_GBPS:g}{extra}", fix, node=i)


@rule
def nodes_past_worth(c: Context) -> Iterable[Advice]:
    """More nodes than the model says pay for themselves: past that count, a node's GPUs add less than half of
    what each GPU does alone (estimate_time.nodes_worth_it), at the link's bandwidth and its source."""
    if c.spec is None or c.cpu or c.nodes < 2 or not c.speed_known:
        return
    g = c.gpus_per_node()
    worth = nodes_worth_it(c.spec, c.t, g, c.bandwidth_gbps, limit=c.nodes, **c.step_kwargs())
    if worth is None or worth >= c.nodes:
        return
    # never a node count that does not fit: fewer nodes shard the model states over fewer GPUs (and put more of an
    # offloaded optimizer on each host); the smallest count from `worth` up that fits is the one offered
    fits = next((n for n in range(worth, c.nodes) if _fits_on(c, n)), None)
    if fits is None:
        return
    worth = fits
    yield Advice(Level.WARNING, "NODES_PAST_WORTH",
                 f"past {worth} node(s) each further node adds less than half its GPUs' worth at "
                 f"{c.bandwidth_gbps:.3g} Gbit/s between nodes ({c.bandwidth.source}"
                 + (", a lower bound" if c.bandwidth.lower_bound else "")
                 + f"): {c.nodes} nodes are estimated at ~{c.step_here().tokens_per_second:,.0f} tokens/s",
                 Fix(f"Use {worth} node(s)", hint=f"drop nodes past {worth}, or get a faster link between them "
                     "(more NICs for NCCL, InfiniBand/RoCE)"))


@rule
def port_unreachable(c: Context) -> Iterable[Advice]:
    if c.facts is None:
        return
    port = c.preset.network.master_port
    if c.facts.master_port_free is False:
        yield Advice(Level.ERROR, "PORT_IN_USE", f"master port {port} is already in use on node 0",
                     Fix(f"Use port {port + 1}", {"network.master_port": port + 1}), node=0)
    for i, lk in sorted(c.facts.links.items()):
        if lk.port_reachable is False:
            why = f" ({lk.port_error})" if lk.port_error else ""
            yield Advice(Level.ERROR, "PORT_UNREACHABLE",
                         f"node {i} cannot reach {c.preset.master_addr}:{port}{why}; rendezvous would hang "
                         f"{c.preset.network.rdzv_timeout} s and fail",
                         Fix("Open the port", hint=f"allow TCP {port} (and NCCL's ports) into node 0 from node {i}, "
                             "e.g. sudo iptables -I INPUT -p tcp -s <node ip> -j ACCEPT"), node=i)


@rule
def timeouts(c: Context) -> Iterable[Advice]:
    n = c.preset.network
    if n.rdzv_timeout > RDZV_TIMEOUT_MAX_S:
        yield Advice(Level.WARNING, "RDZV_TIMEOUT_LONG",
                     f"rendezvous timeout {n.rdzv_timeout} s: a node that never starts keeps the others waiting "
                     f"{n.rdzv_timeout / 60:.0f} min before anything fails", Fix("Rendezvous timeout 120 s",
                                                                                   {"network.rdzv_timeout": 120}))
    if n.nccl_timeout > NCCL_TIMEOUT_MAX_S:
        yield Advice(Level.WARNING, "NCCL_TIMEOUT_LONG",
                     f"NCCL timeout {n.nccl_timeout} s: a hung collective holds every GPU {n.nccl_timeout / 3600:.1f} h "
                     "before the job fails", Fix("NCCL timeout 1800 s", {"network.nccl_timeout": 1800}))
    off = {k: v for k, v in n.env.items()
           if (k in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING") and v.strip() == "0")}
    if off:
        env = {k: v for k, v in n.env.items() if k not in off}
        yield Advice(Level.WARNING, "TIMEOUT_NONE",
                     f"network.env sets {', '.join(f'{k}={v}' for k, v in off.items())}: a hung collective is never "
                     "aborted, the job hangs instead of failing", Fix("Remove it", {"network.env": env}))


# the other modules' rules register after these, in this order
# isort: off
from . import cluster  # noqa: E402,F401 - registers the rules about the nodes' facts
from . import moe  # noqa: E402,F401 - registers the mixture-of-experts rules
from . import preference  # noqa: E402,F401 - registers the DPO rules
from . import fp8  # noqa: E402,F401 - registers the FP8 rules
from . import longcontext  # noqa: E402,F401 - and those about long records and sequence parallelism

# isort: on

# ---------------------------------------------------------------- entry point

def advise(preset: Preset, facts: ClusterFacts | None = None, **kwargs: Any) -> list[Advice]:
    """Every rule's advice, errors first. kwargs go to make_context (spec, gpu, gpu_memory_gib, bandwidth_gbps,
    efficiency, base_dir)."""
    c = make_context(preset, facts, **kwargs)
    out: list[Advice] = []
    for r in RULES:
        out.extend(r(c))
    return sorted(out, key=loudest_first)
