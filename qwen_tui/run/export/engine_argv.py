"""What the engine exports (Kubeflow, SkyPilot) take from a LaunchPlan: each node's torchrun argv with the
rendezvous flags the engine fills in, the plan's environment split into plain values and secrets, and the
checks that the plan is one an engine of identical nodes can run.

The argv stays the plan's own, word for word, except the five flags that say where a node sits in the job
(node count, node rank, processes a node, master address and port): the engine knows those only when the
job starts.
"""

from __future__ import annotations

import re

from ...base.redact import is_secret
from ...plan.launch import LaunchPlan, NodeCommand

# torchrun's flags that place a node in the job, in the order make_plan writes them.
RENDEZVOUS_FLAGS = ("--nnodes", "--node_rank", "--nproc_per_node", "--master_addr", "--master_port")
# The plan's per-node variables that only restate those flags (the worker reads torchrun's own variables):
# an engine's export sets them from the engine's values or leaves them out.
PLACEMENT_ENV = ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


class Shell(str):
    """A value written into a shell script as it is (a variable reference), not quoted."""


class ExportError(ValueError):
    """A plan this engine cannot express; the message names the field and what to change."""


def launcher_part(argv: list[str]) -> int:
    """Index where the worker's module starts (`-m training.finetune`): flags before it are torchrun's."""
    for i in range(len(argv) - 1):
        if argv[i] == "-m" and argv[i + 1] == "training.finetune":
            return i
    raise ExportError("the plan's command does not run training.finetune")


def with_rendezvous(cmd: NodeCommand, values: dict[str, str | None]) -> list[str]:
    """The node's argv with each rendezvous flag of `values` given that value, or left out where it maps to None
    (torchrun then reads it from its PET_* variable). Flags after the worker's module are never touched."""
    unknown = set(values) - set(RENDEZVOUS_FLAGS)
    if unknown:
        raise ValueError(f"not rendezvous flags: {sorted(unknown)}")
    end = launcher_part(cmd.argv)
    out: list[str] = []
    i = 0
    while i < end:
        a = cmd.argv[i]
        if a in values and i + 1 < end:
            if values[a] is not None:
                out += [a, values[a]]
            i += 2
            continue
        out.append(a)
        i += 1
    return out + cmd.argv[end:]


def uniform_nproc(plan: LaunchPlan, engine: str) -> int:
    """The processes every node runs: engines of identical nodes need one number for all."""
    counts = [c.nproc for c in plan.nodes]
    if len(set(counts)) != 1:
        odd = next(c for c in plan.nodes if c.nproc != counts[0])
        raise ExportError(f"cluster.nodes.{odd.rank}.gpus: {engine} runs the same number of processes on every "
                          f"node, but node {odd.rank} ({odd.label}) has {odd.nproc} and node 0 has {counts[0]}; "
                          "give every node the same gpus")
    return counts[0]


def on_cpu(plan: LaunchPlan) -> bool:
    """A CPU run (training.device: cpu): its processes are CPU processes, not GPUs to ask the engine for."""
    return "--use_cpu" in plan.nodes[0].argv


def split_env(env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """(plain variables, names of secrets): a secret's value is never written, only its name."""
    plain = {k: v for k, v in env.items() if k not in PLACEMENT_ENV and not is_secret(k)}
    secrets = [k for k in env if k not in PLACEMENT_ENV and is_secret(k)]
    return plain, secrets


def dns_label(run_id: str, prefix: str = "qwen-tui-", limit: int = 63) -> str:
    """A Kubernetes-style name (DNS-1123 label: lowercase letters, digits and '-', at most `limit` characters,
    starting and ending with a letter or digit) from a run id."""
    body = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    name = (prefix + body)[:limit].rstrip("-")
    return name or "qwen-tui"


def header(plan: LaunchPlan, engine: str) -> list[str]:
    """The comment lines every engine file opens with."""
    return [f"# qwen-tui launch plan {plan.run_id} as a {engine}: {plan.nnodes} nodes, world size "
            f"{plan.world_size}, backend {plan.backend}",
            f"# effective batch size: {plan.batch_formula}"]
