"""Render a LaunchPlan as batch scripts: SLURM (sbatch + srun), PBS, or one plain
shell script per node; or as an engine's job file: a Kubeflow Trainer TrainJob
(kubeflow.py) or a SkyPilot task (skypilot.py). Same argv and
environment as `replay`; only the node rank and master address come from the
scheduler where it assigns the nodes. Secrets (HF_TOKEN, ...) are not written:
the scripts read them from their environment.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from ...base.redact import is_secret
from ...cluster.facts import ClusterFacts
from ...plan.launch import LaunchPlan, NodeCommand, make_plan
from ...preset.schema import Preset
from .kubeflow import render_kubeflow
from .skypilot import render_skypilot

FORMATS = ("slurm", "pbs", "sh", "kubeflow", "skypilot")
# Engines that place the nodes themselves: one YAML file each, given the image and (SkyPilot) the accelerator.
ENGINES: dict[str, tuple[str, Callable[..., str]]] = {
    "kubeflow": ("trainjob.yaml", lambda plan, image=None, accelerator=None: render_kubeflow(plan, image)),
    "skypilot": ("sky.yaml", render_skypilot),
}


def _argv_with(cmd: NodeCommand, replace: dict[str, str]) -> str:
    """Quote the node's command (in its container where it has one), but let the values of `replace` flags be shell
    expressions."""
    out, skip = [], False
    argv = cmd.command
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in replace and i + 1 < len(argv):
            out += [shlex.quote(a), replace[a]]
            skip = True
        else:
            out.append(shlex.quote(a))
    return " ".join(out)


def _env_value(k: str, v: str) -> str:
    """A value as the script writes it. A secret (redact.is_secret) is never written into
    the script: it is read from the environment the script runs in, which must set it."""
    if is_secret(k):
        return f'"${{{k}:?set {k} in the environment that runs this script}}"'
    return shlex.quote(v)


def _env_lines(env: dict[str, str], skip: tuple[str, ...] = ()) -> list[str]:
    return [f"export {k}={_env_value(k, v)}" for k, v in env.items() if k not in skip]


def _header(plan: LaunchPlan) -> list[str]:
    return [
        f"# qwen-tui launch plan {plan.run_id}: {plan.nnodes} nodes, world size {plan.world_size}, "
        f"backend {plan.backend}",
        f"# effective batch size: {plan.batch_formula}",
    ]


def render_sh(plan: LaunchPlan, cmd: NodeCommand) -> str:
    lines = ["#!/usr/bin/env bash", *_header(plan), f"# node {cmd.rank} ({cmd.label}): run this on that node",
             "set -euo pipefail", f"cd {shlex.quote(cmd.workdir)}", *_env_lines(cmd.env),
             "exec " + " ".join(shlex.quote(a) for a in cmd.command), ""]
    return "\n".join(lines)


def on_cpu(plan: LaunchPlan) -> bool:
    """A CPU run (training.device: cpu): its processes are CPU processes, not GPUs to ask the scheduler for."""
    return "--use_cpu" in plan.nodes[0].argv


def render_slurm(plan: LaunchPlan) -> str:
    head = plan.nodes[0]
    gpus = head.nproc
    env_skip = ("NODE_RANK", "MASTER_ADDR")
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name=qwen-tui-{plan.run_id}",
        f"#SBATCH --nodes={plan.nnodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={gpus}"] if not on_cpu(plan) else []),
        f"#SBATCH --cpus-per-task={max(4, 8 * gpus)}",
        *_header(plan),
        "set -euo pipefail",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_ADDR",
        *_env_lines(head.env, env_skip),
        f"cd {shlex.quote(head.workdir)}",
        # one task per node; each computes its node rank from SLURM inside the task
        "srun --kill-on-bad-exit=1 bash -c " + shlex.quote(
            "NODE_RANK=$SLURM_NODEID exec "
            + _argv_with(head, {"--node_rank": '"$SLURM_NODEID"', "--master_addr": '"$MASTER_ADDR"'})),
        "",
    ]
    return "\n".join(lines)


def render_pbs(plan: LaunchPlan) -> str:
    head = plan.nodes[0]
    gpus = head.nproc
    env_skip = ("NODE_RANK", "MASTER_ADDR")
    inner = ("cd " + shlex.quote(head.workdir) + " && "
             + " ".join(f"{k}={_env_value(k, v)}" for k, v in head.env.items() if k not in env_skip)
             + ' NODE_RANK="$1" MASTER_ADDR="$2" '
             + _argv_with(head, {"--node_rank": '"$1"', "--master_addr": '"$2"'}))
    lines = [
        "#!/usr/bin/env bash",
        f"#PBS -N qwen-tui-{plan.run_id}"[:240],
        f"#PBS -l select={plan.nnodes}:" + (f"ncpus={max(4, 8 * gpus)}" if on_cpu(plan) else f"ngpus={gpus}")
        + ":mpiprocs=1",
        "#PBS -j oe",
        *_header(plan),
        "set -euo pipefail",
        'mapfile -t HOSTS < <(sort -u "$PBS_NODEFILE")',
        f'if [ "${{#HOSTS[@]}}" -ne {plan.nnodes} ]; then echo "expected {plan.nnodes} nodes, got ${{#HOSTS[@]}}" >&2; exit 1; fi',
        'MASTER_ADDR=${HOSTS[0]}',
        "NODE_SCRIPT=" + shlex.quote(inner),
        "pids=()",
        'for i in "${!HOSTS[@]}"; do',
        # the node script travels as one quoted word; rank and master are its positional args
        '  ssh -o BatchMode=yes "${HOSTS[$i]}" bash -c "$(printf %q "$NODE_SCRIPT")" qwen-tui "$i" "$MASTER_ADDR" &',
        '  pids+=("$!")',
        "done",
        'rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done',
        'exit "$rc"',
        "",
    ]
    return "\n".join(lines)


def render(plan: LaunchPlan, fmt: str, image: str | None = None,
           accelerator: str | None = None) -> dict[str, str]:
    """File name -> script text. `image` and `accelerator` are the engines' (ENGINES) container image and GPU."""
    if fmt in ENGINES:
        suffix, engine = ENGINES[fmt]
        return {f"{plan.run_id}.{suffix}": engine(plan, image=image, accelerator=accelerator)}
    if fmt == "sh":
        return {f"node-{c.rank}.sh": render_sh(plan, c) for c in plan.nodes}
    renderers: dict[str, Callable[[LaunchPlan], str]] = {"slurm": render_slurm, "pbs": render_pbs}
    if fmt not in renderers:
        raise ValueError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}")
    suffix = {"slurm": "sbatch", "pbs": "pbs"}[fmt]
    return {f"{plan.run_id}.{suffix}": renderers[fmt](plan)}


def export_files(preset: Preset, fmt: str, *, run_id: str, base_dir: str, preset_file: str | None = None,
                 facts: ClusterFacts | None = None, image: str | None = None,
                 accelerator: str | None = None) -> dict[str, str]:
    """What `qwen-tui export` and the wizard's export write: file name -> text. A SLURM preset's `slurm` export is
    the batch script replay submits, reading `preset_file` (run/export/slurm_preset.py); every other one renders the
    plan. Raises ValueError for what the format cannot express."""
    if preset.scheduler.is_slurm and fmt == "slurm":
        from ..rundir import default_runs_root
        from .slurm_preset import exported_script

        if preset_file is None:
            raise ValueError("a SLURM preset's batch script reads the preset's file: save the preset first")
        return {f"{run_id}.sbatch": exported_script(preset, preset_file=preset_file,
                                                    runs_root=str(default_runs_root()))}
    plan = make_plan(preset, run_id=run_id, local_run_dir=f"runs/{run_id}", base_dir=base_dir, facts=facts)
    return render(plan, fmt, image=image, accelerator=accelerator)
