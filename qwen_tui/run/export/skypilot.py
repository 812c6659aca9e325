"""A LaunchPlan as a SkyPilot task (`sky launch THIS_FILE`).

SkyPilot starts `num_nodes` nodes and runs the task's `run` script on each with SKYPILOT_NODE_RANK (this
node's rank), SKYPILOT_NODE_IPS (every node's address, one a line, node 0 first), SKYPILOT_NUM_NODES and
SKYPILOT_NUM_GPUS_PER_NODE set. The script is the plan's argv, word for word, with torchrun's placement
flags taken from those variables (the master is the first address), after a `cd` to the node's workdir,
as every export does. The plan's plain variables go to `envs`; a secret (HF_TOKEN, ...) is only named under
`secrets` with no value, so SkyPilot asks for it at launch (`sky launch --secret HF_TOKEN`, from the
launching shell's environment) and it is never written.

`setup` checks that the node's Python has the worker, so a node without it fails before any node trains.
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from ...plan.launch import LaunchPlan
from .engine_argv import ExportError, Shell, dns_label, header, on_cpu, split_env, uniform_nproc, with_rendezvous

# The GPUs SkyPilot may choose from when the user names none (--accelerator): the ones Qwen fine-tuning runs on.
DEFAULT_ACCELERATORS = ("H100", "H200", "A100-80GB")


def run_script(plan: LaunchPlan) -> str:
    head = plan.nodes[0]
    nproc = Shell('"$SKYPILOT_NUM_GPUS_PER_NODE"') if not on_cpu(plan) else str(head.nproc)
    argv = with_rendezvous(head, {"--nnodes": Shell('"$SKYPILOT_NUM_NODES"'),
                                  "--node_rank": Shell('"$SKYPILOT_NODE_RANK"'),
                                  "--nproc_per_node": nproc,
                                  "--master_addr": Shell('"$MASTER_ADDR"'),
                                  "--master_port": str(plan.master_port)})
    words = [a if isinstance(a, Shell) else shlex.quote(a) for a in argv]
    return "\n".join([
        "set -euo pipefail",
        f"cd {shlex.quote(head.workdir)}",
        'MASTER_ADDR=$(printf \'%s\\n\' "$SKYPILOT_NODE_IPS" | head -n 1)',
        'NODE_RANK=$SKYPILOT_NODE_RANK',
        'NNODES=$SKYPILOT_NUM_NODES',
        f"MASTER_PORT={plan.master_port}",
        "export MASTER_ADDR NODE_RANK NNODES MASTER_PORT",
        "exec " + " ".join(words),
        "",
    ])


def setup_script(plan: LaunchPlan) -> str:
    py = shlex.quote(plan.nodes[0].argv[0])
    msg = shlex.quote(f"the worker of qwen-tui (its training package) is not installed for {plan.nodes[0].argv[0]} "
                      "on this node: pip install qwen-tui[train], or use an image that has it")
    return f"{py} -c 'import training.finetune' || {{ echo {msg} >&2; exit 1; }}\n"


def task(plan: LaunchPlan, accelerator: str | None = None, image: str | None = None) -> dict[str, Any]:
    nproc = uniform_nproc(plan, "SkyPilot")
    plain, secrets = split_env(plan.nodes[0].env)
    resources: dict[str, Any]
    if on_cpu(plan) and accelerator:
        raise ExportError(f"training.device: cpu, so the run asks for no GPU; leave out --accelerator {accelerator}")
    if on_cpu(plan):
        resources = {"cpus": f"{max(4, 2 * nproc)}+"}
    elif accelerator:
        resources = {"accelerators": f"{accelerator}:{nproc}"}
    else:
        resources = {"accelerators": {a: nproc for a in DEFAULT_ACCELERATORS}}
    if image:
        resources["image_id"] = f"docker:{image}"
    out: dict[str, Any] = {"name": dns_label(plan.run_id), "num_nodes": plan.nnodes, "resources": resources}
    if plain:
        out["envs"] = plain
    if secrets:
        out["secrets"] = {k: None for k in secrets}
    out["setup"] = setup_script(plan)
    out["run"] = run_script(plan)
    return out


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the scripts) as literal blocks, so the file reads as the scripts it runs."""


def _str(dumper: yaml.SafeDumper, s: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)


def render_skypilot(plan: LaunchPlan, accelerator: str | None = None, image: str | None = None) -> str:
    t = task(plan, accelerator, image)
    lines = [*header(plan, "SkyPilot task"),
             "# the nodes' placement comes from SkyPilot: SKYPILOT_NODE_RANK, the first of SKYPILOT_NODE_IPS as "
             "the master, SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE"]
    if "accelerators" in t["resources"] and not accelerator:
        lines.append(f"# accelerators: any of {', '.join(DEFAULT_ACCELERATORS)} (qwen-tui export --accelerator "
                     "NAME asks for one)")
    if "secrets" in t:
        lines.append(f"# secrets: given at launch, never written here: sky launch --secret "
                     f"{' --secret '.join(t['secrets'])} THIS_FILE")
    lines.append("# launch: sky launch THIS_FILE")
    return "\n".join(lines) + "\n" + yaml.dump(t, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                                               width=1000, allow_unicode=True)
