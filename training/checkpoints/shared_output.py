"""--save_on_each_node with an output_dir that is in fact one filesystem for every node.

Every node's first process would then write the same checkpoint and model files at once, and the run fails at
its first save (one node clears the staging directory another is writing, or renames it away first). qwen-tui's
checks refuse that launch (SHARED_STORAGE_UNDECLARED), but a launch past them (--force, --skip-checks, a node the
check could not read) or a hand-written torchrun command reaches the worker anyway. So the worker measures it
too, before anything is written: each node's first process leaves a marker in output_dir (or its nearest existing
parent) and says so through torchrun's agent store; each then reports which other nodes' markers it sees.

- every node sees every other's: output_dir is shared, and only rank 0 saves (as without --save_on_each_node);
- no node sees another's: each node keeps its own copy, as asked;
- some do and some do not: InputError naming the nodes that share, since no one saver choice is right.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from datetime import timedelta

from training.checkpoints.resume_agreement import agent_store
from training.runtime.errors import InputError

log = logging.getLogger("training")


def _marker_dir(output_dir: str) -> tuple[str, str]:
    """(output_dir or its nearest existing parent, the part of output_dir below it yet to be made). Creates
    nothing. Two nodes' output_dirs are one directory when one's marker shows in the other's marker directory and
    the parts yet to be made are the same."""
    d = os.path.abspath(output_dir)
    while not os.path.isdir(d):
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return d, os.path.relpath(os.path.abspath(output_dir), d)


def nodes_sharing(output_dir: str, timeout_s: float) -> dict[int, list[int]] | None:
    """node -> the other nodes whose markers it sees, through torchrun's store; None where there is nothing to
    measure (no store, or one node). Every rank takes part and gets the same answer."""
    try:
        nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    except ValueError:
        return None
    store = agent_store(timeout_s) if nodes > 1 else None
    if store is None:
        return None
    node, first = int(os.environ.get("GROUP_RANK", "0")), os.environ.get("LOCAL_RANK", "0") == "0"
    prefix = f"qwen_tui/shared_output/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    wait = timedelta(seconds=timeout_s)
    where, rest = _marker_dir(output_dir)
    marker = None
    try:
        if first:
            marker = os.path.join(where, f".qwen-tui-node-{node}-{secrets.token_hex(8)}")
            with open(marker, "x", encoding="utf-8") as f:
                f.write(str(node))
            store.set(f"{prefix}/marker/{node}", json.dumps({"name": os.path.basename(marker), "rest": rest}))
        store.wait([f"{prefix}/marker/{n}" for n in range(nodes)], wait)
        if first:
            theirs = {n: json.loads(store.get(f"{prefix}/marker/{n}")) for n in range(nodes) if n != node}
            seen = sorted(n for n, m in theirs.items()
                          if m["rest"] == rest and os.path.exists(os.path.join(where, m["name"])))
            store.set(f"{prefix}/seen/{node}", json.dumps(seen))
        store.wait([f"{prefix}/seen/{n}" for n in range(nodes)], wait)
        return {n: json.loads(store.get(f"{prefix}/seen/{n}")) for n in range(nodes)}
    finally:
        if marker is not None:
            os.unlink(marker)


def decide(output_dir: str, timeout_s: float) -> bool:
    """Whether --save_on_each_node should stand: False when output_dir is one filesystem for every node (then
    rank 0 alone saves). InputError when only some nodes share it."""
    seen = nodes_sharing(output_dir, timeout_s)
    if seen is None or not any(seen.values()):
        return True
    if all(len(others) == len(seen) - 1 for others in seen.values()):
        log.warning("%s is one filesystem for every node: rank 0 alone saves the checkpoints and the model "
                    "(--save_on_each_node would have every node write the same files at once)", output_dir)
        return False
    groups = "; ".join(f"node {n} sees node(s) {', '.join(map(str, o))}" if o else f"node {n} sees none"
                       for n, o in sorted(seen.items()))
    raise InputError(f"--output_dir {output_dir} is shared by some nodes but not all ({groups}): put it on storage "
                     "every node sees, or on each node's own disk")
