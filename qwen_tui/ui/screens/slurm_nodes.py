"""What the Nodes step shows and asks when SLURM gives the run its nodes (scheduler.kind: slurm): one summary of
what to ask SLURM for, a form for it, and the switch between SSH nodes and SLURM."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from ...preset.schema import Preset

# (field of scheduler, label in the form)
FIELDS = [("nodes", "nodes"), ("gpus_per_node", "GPUs (processes) per node"), ("partition", "partition"),
          ("account", "account"), ("qos", "qos"), ("time", "time limit (sbatch --time)"),
          ("cpus_per_node", "CPUs per node"), ("constraint", "constraint (node features)"),
          ("workdir", "workdir (shared storage)"), ("python", "python on the nodes")]
LABELS = {f"scheduler.{k}": v for k, v in FIELDS}
NUMBERS = ("nodes", "gpus_per_node", "cpus_per_node")


def summary(preset: Preset) -> Text:
    s = preset.scheduler
    t = Text()
    t.append("SLURM gives this run its nodes.\n\n", style="bold")
    t.append(f"  {s.nodes} node(s) x {s.gpus_per_node} process(es)", style="bold")
    where = ", ".join(f"{k} {v}" for k, v in (("partition", s.partition), ("account", s.account), ("qos", s.qos),
                                              ("time", s.time), ("constraint", s.constraint)) if v)
    t.append(f"  {where or 'the cluster defaults (partition, account, time)'}\n")
    t.append(f"  workdir {s.workdir} · python {s.python}\n\n")
    t.append("Launching (the Run step) submits the batch job from this machine with sbatch and follows it: PENDING "
             "with SLURM's reason, then the nodes SLURM chose, every node checked through srun inside the job, "
             "and the same Run view as over SSH. Inside an allocation (salloc) the run takes the allocation's "
             "nodes instead.\n", style="dim")
    t.append("e edits what to ask SLURM for · k switches back to SSH nodes · `qwen-tui check` checks nodes SLURM "
             "gives now (salloc)", style="dim")
    return t


def form_fields(preset: Preset) -> list[tuple[str, str, str]]:
    s = preset.scheduler
    return [(k, label, "" if getattr(s, k) is None else str(getattr(s, k))) for k, label in FIELDS]


def changes_of(answer: dict[str, str]) -> dict[str, Any]:
    """The form's answers as preset changes (an empty optional field unsets it)."""
    out: dict[str, Any] = {}
    for k, _ in FIELDS:
        text = answer.get(k, "").strip()
        if k in NUMBERS:
            out[f"scheduler.{k}"] = int(text) if text.isdigit() else (None if not text else text)
        else:
            out[f"scheduler.{k}"] = text or None
    for k in ("nodes", "gpus_per_node", "workdir", "python"):  # required: an empty one keeps its default
        if out[f"scheduler.{k}"] is None:
            out.pop(f"scheduler.{k}")
    return out


def to_slurm(preset: Preset) -> dict[str, Any]:
    """The changes that make an SSH preset a SLURM one of the same shape."""
    nodes = preset.cluster.nodes
    return {"scheduler.kind": "slurm", "cluster.nodes": [],
            "scheduler.nodes": max(1, len(nodes)), "scheduler.gpus_per_node": nodes[0].gpus if nodes else 1}


def to_ssh(preset: Preset) -> dict[str, Any]:
    """The changes that make a SLURM preset an SSH one: this machine as its only node, to edit from there."""
    s = preset.scheduler
    return {"scheduler.kind": "ssh", "scheduler.job_id": None,
            "cluster.nodes": [{"host": "localhost", "gpus": s.gpus_per_node}]}
