"""Which checkpoint to resume from when every node keeps its own (--save_on_each_node, no shared storage).

A crash during a save can leave the nodes with different newest checkpoints: node 0 published checkpoint-30,
node 1 died before renaming its checkpoint-30.tmp. Resuming each node from its own newest would mix steps.
So the ranks agree: each tells the others which complete checkpoints its node holds, and all resume from the
newest step that every node holds complete. When there is none (a node rotated away the others' steps), every
rank refuses, naming the nodes and what each holds.

The resume is chosen before the process group exists, so the ranks talk through the store torchrun's agents
already share (TORCHELASTIC_USE_AGENT_STORE, at MASTER_ADDR:MASTER_PORT). Without it (one process, or a launcher
without a shared store) each rank decides alone, as before.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

from training.runtime.errors import InputError

log = logging.getLogger("training")


@dataclass(frozen=True)
class NodeHolds:
    node: int  # torchrun's GROUP_RANK (the node's rank)
    host: str
    steps: frozenset  # complete checkpoint steps this node holds


def choose(holds: list[NodeHolds], want: int | None = None) -> int | None:
    """The step every node resumes from (pure).

    want=None ('auto'): the newest step every node holds; None when no node holds any. want=N (an explicit
    checkpoint): N, when every node holds it. InputError, naming the nodes, otherwise."""
    nodes = {}
    for h in holds:  # ranks of one node see one directory; should two disagree, keep what both see
        prev = nodes.get(h.node)
        nodes[h.node] = h if prev is None else NodeHolds(h.node, h.host, prev.steps & h.steps)
    ordered = [nodes[k] for k in sorted(nodes)]

    def held(h: NodeHolds) -> str:
        return f"node {h.node} ({h.host}): " + (", ".join(f"checkpoint-{s}" for s in sorted(h.steps)) or "none")

    if want is not None:
        lacking = [h for h in ordered if want not in h.steps]
        if lacking:
            raise InputError(f"--resume_from_checkpoint checkpoint-{want} is not complete on every node; "
                             f"lacking it: {'; '.join(held(h) for h in lacking)}")
        return want
    if not any(h.steps for h in ordered):
        return None
    common = frozenset.intersection(*(h.steps for h in ordered))
    if not common:
        raise InputError("--resume_from_checkpoint auto: the nodes hold no complete checkpoint in common ("
                         + "; ".join(held(h) for h in ordered) + "); copy one checkpoint to every node, or start "
                         "afresh in an empty output_dir")
    step = max(common)
    ahead = [h for h in ordered if max(h.steps) > step]
    if ahead:
        behind = [h for h in ordered if step == max(h.steps)]
        log.warning("resuming from checkpoint-%d, the newest step every node holds complete: %s newer (%s); "
                    "%s", step, "; ".join(f"node {h.node} ({h.host}) has checkpoint-{max(h.steps)}" for h in ahead),
                    "a save was cut short", ", ".join(f"node {h.node} ({h.host})" for h in behind) + " stop there")
    return step


def agent_store(timeout_s: float):
    """torchrun's agent store (every rank of the job can reach it before any process group), or None."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return None
    from torch.distributed import TCPStore

    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                    timeout=timedelta(seconds=timeout_s))


def gather_holds(mine: list[int], timeout_s: float) -> list[NodeHolds] | None:
    """Every rank's NodeHolds through torchrun's store; None where there is no store to share."""
    store = agent_store(timeout_s)
    if store is None:
        return None
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"qwen_tui/resume/{attempt}"
    node = int(os.environ.get("GROUP_RANK", "0"))
    store.set(f"{prefix}/{rank}", json.dumps({"node": node, "host": socket.gethostname(), "steps": sorted(mine)}))
    keys = [f"{prefix}/{r}" for r in range(world)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except Exception as e:  # the store's own timeout or a lost agent: name what was missing
        missing = [r for r in range(world) if not store.check([f"{prefix}/{r}"])]
        raise TimeoutError(f"waited {timeout_s:g} s for every rank's list of checkpoints; missing ranks "
                           f"{missing}: {e}") from None
    out = []
    for k in keys:
        d = json.loads(store.get(k))
        out.append(NodeHolds(int(d["node"]), str(d["host"]), frozenset(int(s) for s in d["steps"])))
    return out
