"""Advice rules about the cluster as probed (facts): one host twice, GPUs, package versions and fast kernels that
differ between nodes, data and model files missing on a node, storage that is shared but not declared so.
Registered in RULES when qwen_tui.advice.rules imports this module, after its own rules."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..base.levels import Level
from ..cluster.facts import file_fact
from .core import Advice, Context, Fix, rule

# ---------------------------------------------------------------- cluster consistency (facts)

@rule
def duplicate_host(c: Context) -> Iterable[Advice]:
    nodes = c.preset.cluster.nodes
    seen: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.is_local:
            continue
        if n.host in seen:
            yield Advice(Level.WARNING, "DUPLICATE_HOST",
                         f"nodes {seen[n.host]} and {i} are both {n.host} (ports {nodes[seen[n.host]].port} and "
                         f"{n.port}): one machine twice unless these are separate containers", node=i)
        else:
            seen[n.host] = i
    names: dict[str, int] = {}
    for i, nf in c.node_facts():
        if nf.hostname is None or i >= len(nodes) or nodes[i].is_local:
            continue
        if nf.hostname in names and nodes[names[nf.hostname]].host != nodes[i].host:
            yield Advice(Level.ERROR, "DUPLICATE_HOST",
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
            yield Advice(Level.ERROR, "GPU_COUNT", f"{host} has {have} GPUs but the preset starts {want} processes there",
                         fix, node=i)
    models = {i: nf.gpu_model for i, nf in c.node_facts() if nf.gpus}
    if len(set(models.values())) > 1:
        desc = ", ".join(f"node {i}: {m}" for i, m in models.items())
        yield Advice(Level.WARNING, "GPU_MISMATCH", f"different GPU models ({desc}): every rank runs at the slowest's pace "
                     "and the smallest memory decides what fits")
    counts = [n.gpus for n in nodes]
    if len(set(counts)) > 1:
        yield Advice(Level.WARNING, "GPU_MISMATCH",
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
            yield Advice(Level.ERROR, "PACKAGE_MISSING", f"{pkg} is not installed on node(s) {', '.join(map(str, missing))}",
                         Fix(f"Install {pkg}", hint=f"install it into each node's Python ({pkg} on node {missing[0]})"),
                         node=missing[0])
    for pkg in VERSIONED + ("python",):
        vals = {i: (nf.python_version if pkg == "python" else nf.versions.get(pkg)) for i, nf in facts}
        vals = {i: v for i, v in vals.items() if v}
        if len(set(vals.values())) < 2:
            continue
        mm = {".".join(v.split("+")[0].split(".")[:2]) for v in vals.values()}
        level = Level.ERROR if pkg in WIRE and len(mm) > 1 else Level.WARNING
        desc = ", ".join(f"node {i}: {v}" for i, v in vals.items())
        ref = vals.get(0) or next(iter(vals.values()))
        yield Advice(level, "VERSION_MISMATCH", f"{pkg} differs across nodes ({desc})",
                     Fix(f"Install {pkg} {ref} everywhere", hint=f"pip install '{pkg}=={ref}' on the other nodes"
                         if pkg != "python" else "use the same Python on every node (cluster.nodes[].python)"))


# The worker's fast path (with or without DeepSpeed) picks these up by itself where installed (training.fast.choice);
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
        yield Advice(Level.WARNING if mixed else Level.INFO, "FAST_KERNEL_MISSING", msg,
                     Fix(f"Install {pkg}", hint=f"pip install {pkg} (or qwen-tui's [gpu] extra) into the Python of "
                         f"node {lacking[0]}"), node=lacking[0])


def _file_rules(c: Context, what: str) -> Iterable[Advice]:
    """`what`: "data", "model", or a field of the run's other data files (eval_data, datasets.K.path, ...)."""
    got = {i: ff for i, nf in c.node_facts() if (ff := file_fact(nf, what)) is not None}
    model = what == "model"
    if what in ("data", "model"):
        path, noun = getattr(c.t, what), what
        if not path or path.startswith("builtin:"):
            return
    elif got:
        path, noun = next(iter(got.values())).path, f"training.{what}"
    else:
        return
    for i, ff in got.items():
        if not ff.exists and (i == 0 or (0 in got and not got[0].exists)):  # nowhere to copy it from
            yield Advice(Level.ERROR, "MODEL_MISSING" if model else "DATA_MISSING", f"{path} is missing on node {i}",
                         Fix(f"Correct training.{what}", hint=f"put the {noun} at {path} on node 0 (the master), or "
                             f"set training.{what} to where it is"), node=i)
        elif not ff.exists:
            yield Advice(Level.ERROR, "MODEL_MISSING" if model else "DATA_MISSING", f"{path} is missing on node {i}",
                         Fix(f"Copy the {noun} to node {i}", hint=f"rsync it to the same path on node {i}, or put it "
                             "on shared storage (qwen-tui check --sync copies it from the master)"), node=i)
    sums = {i: ff.sha256 for i, ff in got.items() if ff.exists and ff.sha256}
    sizes = {i: ff.size_bytes for i, ff in got.items() if ff.exists}
    differ = len(set(sums.values())) > 1 or (not sums and len(set(sizes.values())) > 1)
    if differ:
        ref = 0 if 0 in got else min(got)
        odd = [i for i in got if i != ref and ((sums.get(i) and sums.get(i) != sums.get(ref))
                                               or sizes.get(i) != sizes.get(ref))]
        yield Advice(Level.WARNING if model else Level.ERROR, "MODEL_DIFFERS" if model else "DATA_DIFFERS",
                     f"{path} differs between node {ref} and node(s) {', '.join(map(str, odd))} "
                     f"({sizes.get(ref, 0):,} vs {sizes.get(odd[0], 0) if odd else 0:,} bytes)",
                     Fix(f"Copy node {ref}'s {noun}", hint=f"rsync node {ref}'s copy over the others"),
                     node=odd[0] if odd else None)


@rule
def data_files(c: Context) -> Iterable[Advice]:
    yield from _file_rules(c, "data")
    for key in sorted({k for _, nf in c.node_facts() for k in nf.data_files}):
        yield from _file_rules(c, key)


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
    if c.facts is None or c.nodes < 2:
        return
    if all(n.is_local for n in c.preset.cluster.nodes):
        return
    if c.preset.cluster.shared_storage and c.facts.shared_storage is False and c.t.save_strategy != "no":
        yield Advice(Level.WARNING, "NO_SHARED_STORAGE",
                     f"cluster.shared_storage is true but {c.t.output_dir} is not one filesystem on every node: "
                     "checkpoints would be saved by rank 0 only, and each node's ZeRO shards land on its own disk",
                     Fix("Save on every node", {"cluster.shared_storage": False}))
    # with save_strategy "no" too: the final model is saved at the end of every run, by every node when not shared
    if not c.preset.cluster.shared_storage and c.facts.shared_storage is True:
        yield Advice(Level.ERROR, "SHARED_STORAGE_UNDECLARED",
                     f"{c.t.output_dir} is one filesystem on every node but cluster.shared_storage is false: "
                     "every node would write the same model and checkpoint files at once (the run fails at its "
                     "final save)",
                     Fix("Declare shared storage", {"cluster.shared_storage": True}))


# ---------------------------------------------------------------- GPUs inside a node (nvidia-smi topo)

@rule
def p2p_pcie(c: Context) -> Iterable[Advice]:
    """Consumer/workstation GPUs joined over PCIe only: NCCL's peer-to-peer hangs there until it is turned
    off (DeepSpeed#4433, LLaMA-Factory#7300); one network.env change fixes every node (topology.p2p_env)."""
    from ..nodes.checks.topology import P2P_ENV, P2P_FIX_LABEL, p2p_env, p2p_message, p2p_risk

    env = c.preset.network.env
    if c.cpu or c.preset.network.backend == "gloo" or any(k in env for k in P2P_ENV):
        return
    nodes = c.preset.cluster.nodes
    for i, nf in c.node_facts():
        if i >= len(nodes) or nf.topology is None or nodes[i].gpus < 2:
            continue
        risk = p2p_risk(nf.topology, nf.gpu_model or "", nodes[i].gpus)
        if risk is None:
            continue
        msg = p2p_message(f"node {i}", min(nodes[i].gpus, nf.topology.gpus), nf.gpu_model or "GPU", risk)
        if risk.consumer:
            yield Advice(Level.WARNING, "P2P_PCIE", msg, Fix(P2P_FIX_LABEL, {"network.env": p2p_env(env)}), node=i)
        else:
            yield Advice(Level.INFO, "P2P_UNSUPPORTED", msg, node=i)
