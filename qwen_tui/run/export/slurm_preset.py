"""The batch script of a SLURM run: what `qwen-tui replay` submits from a login node, and what
`qwen-tui export --format slurm` writes for a SLURM preset.

The job runs qwen-tui itself, headless, on its first node: `python -m qwen_tui.cli replay` of the run's preset
inside the allocation, which checks every node through srun, starts one job step per node and watches them
(hangs, stragglers, restarts), beside the nodes rather than on a login node a user may log out of. The login
node's qwen-tui only follows the job (run/slurm/follow.py). Everything the job needs is in its options and
the run directory; no secret is written into the script (they come from the environment sbatch passes on).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ...preset.schema import Preset

# sbatch's --signal: USR1 to the batch shell (exec'd into qwen-tui) this many seconds before the time limit
WARN_SIGNAL = "USR1"


def cpus_per_node(preset: Preset) -> int:
    s = preset.scheduler
    if s.cpus_per_node:
        return s.cpus_per_node
    return max(4, 8 * s.gpus_per_node)


def allocation_options(preset: Preset, *, time: str | None = None) -> list[str]:
    """What to ask SLURM for (sbatch's and salloc's options alike): the nodes, their CPUs and GPUs, where and
    under which account; `time` instead of the preset's limit (a short allocation for the checks)."""
    s, t = preset.scheduler, preset.training
    opts = [f"--nodes={s.nodes}", "--ntasks-per-node=1", f"--cpus-per-task={cpus_per_node(preset)}"]
    if t.device != "cpu":
        opts.append(f"--gpus-per-node={s.gpus_per_node}")
    for name, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos),
                        ("time", time or s.time), ("constraint", s.constraint), ("reservation", s.reservation)):
        if value:
            opts.append(f"--{name}={value}")
    if s.exclude:
        opts.append(f"--exclude={','.join(s.exclude)}")
    if s.nodelist:
        opts.append(f"--nodelist={','.join(s.nodelist)}")
    return opts


def sbatch_options(preset: Preset, *, run_dir: str, job_name: str, output: str | None = None) -> list[str]:
    """The #SBATCH options, each as sbatch takes it on its command line."""
    s, t = preset.scheduler, preset.training
    opts = [f"--job-name={job_name}", *allocation_options(preset)]
    if s.warn_before_end:
        opts.append(f"--signal=B:{WARN_SIGNAL}@{s.warn_before_end}")
    opts.append("--requeue" if s.requeue else "--no-requeue")
    if t.restarts:
        opts.append("--no-kill")  # a node that fails leaves the others to the relaunch without it
    opts += [f"--output={output or run_dir + '/slurm-%j.out'}", "--open-mode=append", f"--chdir={s.workdir}"]
    return opts + list(s.extra_sbatch)


def batch_script(preset: Preset, *, run_dir: str, runs_root: str, run_id: str, preset_file: str,
                 replay_flags: Sequence[str] = (), job_name: str | None = None,
                 output: str | None = None) -> str:
    """The whole script. `preset_file` is the preset the job reads (the run directory's copy, for a run qwen-tui
    submits); `run_dir` = runs_root/run_id holds the job's output and the run's files; `replay_flags`: what the
    job's replay is given besides (--skip-checks, --force, --overwrite-output, as the user gave them). `run_id`
    is quoted, unless it is RUN_ID_OF_JOB (a run directory named after the job, for a script submitted by hand);
    `output`: where the job's output goes instead of the run directory."""
    s = preset.scheduler
    name = job_name or f"qwen-tui-{preset.name or run_id}"[:100]
    argv = [s.python, "-m", "qwen_tui.cli", "replay", preset_file, "--runs-dir", runs_root, "--run-id", run_id,
            *replay_flags]
    body = "exec " + " ".join(a if a == RUN_ID_OF_JOB else shlex.quote(a) for a in argv)
    lines = ["#!/bin/bash", *(f"#SBATCH {shlex.quote(o)}" for o in sbatch_options(preset, run_dir=run_dir,
                                                                                   job_name=name, output=output)),
             f"# qwen-tui run {run_id}: {s.nodes} node(s) x {s.gpus_per_node} process(es), the preset {preset_file}",
             "# The job's first node runs qwen-tui headless: it checks every node through srun, starts a job step",
             "# per node and follows them; `qwen-tui attach` on the login node follows it too.",
             "set -eu",
             "export COLUMNS=${COLUMNS:-160}  # the job's log is read as a file, not on an 80-column terminal",
             body, ""]
    return "\n".join(lines)


# The run id of a script submitted by hand: the job's own id, expanded by the batch shell (a requeued job finds
# the run directory of its earlier run under it, and resumes).
RUN_ID_OF_JOB = '"qwen-tui-job-$SLURM_JOB_ID"'


def exported_script(preset: Preset, *, preset_file: str, runs_root: str) -> str:
    """`qwen-tui export --format slurm` of a SLURM preset: the script replay submits, reading `preset_file`, its
    run directory named after the job (runs_root/qwen-tui-job-<id>), its output beside the run directories."""
    return batch_script(preset, run_dir=runs_root, runs_root=runs_root, run_id=RUN_ID_OF_JOB,
                        preset_file=preset_file, job_name=f"qwen-tui-{preset.name or 'run'}"[:100],
                        output=f"{runs_root}/slurm-%j.out")
