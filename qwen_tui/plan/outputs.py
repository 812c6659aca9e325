"""Where each node keeps the checkpoints and the final model, and how much room they take (pure).

With shared storage rank 0 writes one copy that every node sees. Without it (`--save_on_each_node`) every
node writes its own: the model or adapter, its own ranks' optimizer states (a ZeRO shard per rank, or the
whole optimizer under plain DDP) and, at the end, the final model. The sizes come from the model's shape
(modelspec), so a node that cannot hold them is named before launch, not by a failed save hours in.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass

from ..model.spec import ModelSpec
from ..preset.schema import Preset

GiB = 2 ** 30


@dataclass(frozen=True)
class OutputNeed:
    checkpoint_bytes: int  # one checkpoint on this node
    checkpoints: int  # how many can exist at once (kept + the one being written)
    final_bytes: int  # the final model or adapter (and the merged model)
    at_least: bool = False  # no save_total_limit and no max_steps: more checkpoints may pile up

    @property
    def total_bytes(self) -> int:
        return self.checkpoint_bytes * self.checkpoints + self.final_bytes

    def describe(self) -> str:
        parts = []
        if self.checkpoints:
            parts.append(f"{self.checkpoints} checkpoint{'s' if self.checkpoints > 1 else ''} of "
                         f"{gib(self.checkpoint_bytes)}{' (at least: no save_total_limit)' if self.at_least else ''}")
        parts.append(f"the final model {gib(self.final_bytes)}")
        return " + ".join(parts)


def gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB // 10 else f"{n / 2**20:.1f} MiB"


def shared(preset: Preset) -> bool:
    """As the plan decides it: one copy when storage is shared or every node is this machine."""
    nodes = preset.cluster.nodes
    return preset.cluster.shared_storage or all(n.is_local for n in nodes) or len(nodes) == 1


def node_output_dir(preset: Preset, i: int) -> str:
    """training.output_dir as node i's worker resolves it (a relative one is taken from its workdir)."""
    out = preset.training.output_dir
    return out if posixpath.isabs(out) else posixpath.normpath(posixpath.join(preset.cluster.nodes[i].workdir, out))


def places(preset: Preset) -> list[tuple[int, str, str]]:
    """(node index, node label, where its checkpoints and final model live) for every node that holds them."""
    nodes = preset.cluster.nodes
    if shared(preset):
        return [(0, nodes[0].label, node_output_dir(preset, 0) + "  (one copy, written by rank 0, seen by every node)")]
    return [(i, n.label, node_output_dir(preset, i) + "  (this node's own copy)") for i, n in enumerate(nodes)]


def plan_places(plan) -> list[tuple[int, str, str]]:
    """places() read from a LaunchPlan (what print_plan shows): every node with --save_on_each_node, else rank 0."""
    own = any("--save_on_each_node" in c.argv for c in plan.nodes)
    out = []
    for c in plan.nodes if own else plan.nodes[:1]:
        d = plan.output_dir if posixpath.isabs(plan.output_dir) else \
            posixpath.normpath(posixpath.join(c.workdir, plan.output_dir))
        where = "this node's own copy" if own else "one copy, written by rank 0, seen by every node"
        out.append((c.rank, c.label, f"{d}  ({where})"))
    return out


def output_need(preset: Preset, spec: ModelSpec, node: int) -> OutputNeed:
    """Bytes the checkpoints and the final model take on `node` (estimated from the model's shape)."""
    t = preset.training
    world = preset.world_size
    params = spec.total_params
    half = t.precision in ("bf16", "fp16")
    if t.method == "full":
        trainable, weights = params, params * (2 if half else 4)
    else:
        trainable = spec.lora_params(t.lora_r, t.lora_target_modules)
        weights = trainable * 4  # adapters are saved in fp32
    # Adam's two moments in fp32; DeepSpeed keeps an fp32 master copy beside 16-bit weights too
    opt_per_param = 12 if t.zero_stage is not None and half else 8
    opt = trainable * opt_per_param
    if t.zero_stage is not None and not shared(preset):
        opt = opt * preset.cluster.nodes[node].gpus // world  # each rank saves its own shard on its own node
    ckpt = weights + opt
    final = weights
    if t.method != "full" and t.merge_lora:
        final += params * (2 if half else 4)
    at_least = False
    if t.save_strategy == "no":
        n = 0
    elif t.save_total_limit is not None:
        n = t.save_total_limit + 1  # the new one is published before the oldest is deleted
    elif t.max_steps > 0 and t.save_strategy == "steps":
        n = math.ceil(t.max_steps / t.save_steps)
    else:
        n, at_least = 2, True
    return OutputNeed(ckpt, n, final, at_least)


def room_problem(preset: Preset, spec: ModelSpec | None, node: int, free_bytes: int | None) -> str | None:
    """Why `node` has too little room for the run's outputs, or None when it has enough (or cannot be told)."""
    if spec is None or free_bytes is None:
        return None
    if shared(preset) and node != 0:
        return None  # one copy, judged on the master's filesystem
    need = output_need(preset, spec, node)
    if need.total_bytes <= free_bytes:
        return None
    return (f"{preset.cluster.nodes[node].label}: checkpoints and the final model need ~{gib(need.total_bytes)} in "
            f"{node_output_dir(preset, node)} ({need.describe()}), {gib(free_bytes)} free")
