"""A LaunchPlan as a Kubeflow Trainer v2 `TrainJob` (trainer.kubeflow.org/v1alpha1).

The job references the `torch-distributed` ClusterTrainingRuntime. Its Torch plugin gives every node's
container the torchrun placement as PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the node's completion
index), PET_MASTER_ADDR (node 0's pod) and PET_MASTER_PORT, and refuses a TrainJob that sets them itself.
torchrun reads a PET_<FLAG> variable for every flag not given on its command line, so the command is the
plan's argv with those five flags left out: the rest (the worker's flags, the rendezvous timeout, no
restarts) is the plan's, word for word. A short `sh -c` goes to the node's workdir first, as every export
does, and sets the plan's NODE_RANK / MASTER_ADDR from the PET_* values.

Secrets (HF_TOKEN, ...) are never written: each one is read from a Kubernetes Secret (SECRET_NAME) by
`secretKeyRef`. Kubernetes expands `$(NAME)` in a container's command; the literal words that hold `$(` or
`$$` are escaped (`$$`), so the command runs as written.
"""

from __future__ import annotations

from typing import Any

import yaml

from ...plan.launch import LaunchPlan
from .engine_argv import RENDEZVOUS_FLAGS, dns_label, header, on_cpu, split_env, uniform_nproc, with_rendezvous

API_VERSION = "trainer.kubeflow.org/v1alpha1"
RUNTIME = "torch-distributed"  # Kubeflow Trainer's own PyTorch runtime
SECRET_NAME = "qwen-tui-secrets"  # the Kubernetes Secret the job reads secrets from, one key per variable
GPU_RESOURCE = "nvidia.com/gpu"
# Goes to the workdir, restates the placement under the plan's names, then runs the argv after the workdir.
WRAPPER = ('cd -- "$1" && shift && export NNODES="$PET_NNODES" NODE_RANK="$PET_NODE_RANK" '
           'MASTER_ADDR="$PET_MASTER_ADDR" MASTER_PORT="$PET_MASTER_PORT" && exec "$@"')


def k8s_literal(word: str) -> str:
    """`word` as a container command writes it so that Kubernetes' $(VAR) expansion gives it back unchanged."""
    return word.replace("$", "$$") if "$(" in word or "$$" in word else word


def trainjob(plan: LaunchPlan, image: str | None = None) -> dict[str, Any]:
    """The TrainJob as a dict (the YAML's content)."""
    nproc = uniform_nproc(plan, "a Kubeflow TrainJob")
    head = plan.nodes[0]
    argv = with_rendezvous(head, {f: None for f in RENDEZVOUS_FLAGS})
    plain, secrets = split_env(head.env)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in plain.items()]
    env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": SECRET_NAME, "key": k}}} for k in secrets]
    trainer: dict[str, Any] = {"numNodes": plan.nnodes, "numProcPerNode": nproc}
    if image:
        trainer["image"] = image
    if not on_cpu(plan):
        trainer["resourcesPerNode"] = {"limits": {GPU_RESOURCE: str(nproc)}}
    trainer["command"] = [k8s_literal(w) for w in ["sh", "-c", WRAPPER, "qwen-tui", head.workdir, *argv]]
    if env:
        trainer["env"] = env
    return {"apiVersion": API_VERSION, "kind": "TrainJob",
            "metadata": {"name": dns_label(plan.run_id), "labels": {"app.kubernetes.io/managed-by": "qwen-tui"}},
            "spec": {"runtimeRef": {"name": RUNTIME}, "trainer": trainer}}


def render_kubeflow(plan: LaunchPlan, image: str | None = None) -> str:
    job = trainjob(plan, image)
    secrets = [e["name"] for e in job["spec"]["trainer"].get("env", []) if "valueFrom" in e]
    lines = [*header(plan, "Kubeflow Trainer v2 TrainJob"),
             f"# runtime: the {RUNTIME} ClusterTrainingRuntime; torchrun takes the node count, rank, processes a "
             "node, master address and port from the PET_* variables it sets",
             "# image: " + (image or "none given (qwen-tui export --image IMAGE): the runtime's own image runs it, "
                            "and it must hold qwen-tui's worker (pip install 'qwen-tui[train]')")]
    if secrets:
        lines.append(f"# secrets: read from the Secret {SECRET_NAME} (keys {', '.join(secrets)}); create it first, "
                     f"e.g. kubectl create secret generic {SECRET_NAME} --from-env-file=FILE")
    lines.append("# submit: kubectl apply -f THIS_FILE")
    return "\n".join(lines) + "\n" + yaml.safe_dump(job, sort_keys=False, default_flow_style=False, width=1000)
