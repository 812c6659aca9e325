"""A SLURM preset (the scheduler section), the batch script qwen-tui submits for it, and how SLURM's answers are
read: refusals that name the field, sbatch's options as sbatch takes them, the job's own replay as quoted argv,
SLURM's records and node states."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from qwen_tui.nodes.slurm.queries import node_gone, parse_record
from qwen_tui.preset.files import parse_preset
from qwen_tui.preset.scheduler import time_seconds
from qwen_tui.preset.schema import PresetError
from qwen_tui.run.export.slurm_preset import batch_script, sbatch_options

BASE = """\
scheduler: {kind: slurm, nodes: 4, gpus_per_node: 8, partition: gpu, account: "proj 1", time: "1-12:00:00",
            exclude: [bad01], extra_sbatch: ["--mail-type=END"], workdir: /shared/me, python: /shared/venv/bin/python}
cluster: {shared_storage: true}
training: {model: Qwen/Qwen2.5-7B-Instruct, data: /shared/chat.jsonl, restarts: 1}
"""


def _preset(text: str = BASE):
    return parse_preset(text, "p.yaml")


def test_a_slurm_preset_has_as_many_stand_in_nodes_as_it_asks_slurm_for():
    p = _preset()
    assert p.world_size == 32 and [n.host for n in p.slots][:2] == ["slurm-node-0", "slurm-node-1"]
    assert "8 GPUs per node x 4 nodes" in p.batch_formula
    on = p.on_nodes(["gpu7", "gpu9", "gpu11", "gpu12"], "1234")
    assert [n.host for n in on.cluster.nodes] == ["gpu7", "gpu9", "gpu11", "gpu12"]
    assert on.master_addr == "gpu7" and on.cluster.nodes[0].workdir == "/shared/me"
    assert on.cluster.nodes[3].python == "/shared/venv/bin/python" and on.scheduler.job_id == "1234"


@pytest.mark.parametrize("field, value, words", [
    ("scheduler.extra_sbatch", ["--nodes=9"], "qwen-tui sets --nodes itself"),
    ("scheduler.extra_sbatch", ["mail-type=END"], "'--name' or '--name=value'"),
    ("scheduler.time", "90 minutes", "not a SLURM time"),
    ("scheduler.exclude", ["a b"], "not a node name"),
    ("scheduler.nodes", 0, "greater than or equal to 1"),
    ("scheduler.job_id", "12; rm", "not a SLURM job id"),
])
def test_bad_scheduler_values_are_refused_naming_the_field(field, value, words):
    with pytest.raises(PresetError) as e:
        _preset().with_changes({field: value})
    assert [(fe.path, words in fe.message) for fe in e.value.field_errors] == [(field, True)], str(e.value)


def test_a_slurm_preset_takes_no_node_list_and_an_ssh_preset_needs_one():
    with pytest.raises(PresetError, match="cluster.nodes: a SLURM preset takes its nodes from SLURM"):
        _preset(BASE.replace("cluster: {shared_storage: true}", "cluster: {nodes: [{host: a}]}"))
    with pytest.raises(PresetError, match="cluster.nodes: at least one node is needed"):
        _preset("training: {model: m, data: d}\n")


def test_slurm_times_are_read_as_sbatch_reads_them():
    assert [time_seconds(t) for t in ("30", "30:15", "2:00:00", "1-12", "1-12:30", "1-12:30:05", "UNLIMITED")] == \
        [1800, 1815, 7200, 129600, 131400, 131405, 0]


def test_the_batch_script_asks_for_the_preset_and_runs_the_jobs_own_replay_as_quoted_argv():
    p = _preset()
    script = batch_script(p, run_dir="/shared/me/runs/r 1", runs_root="/shared/me/runs", run_id="r 1",
                          preset_file="/shared/me/runs/r 1/preset.submitted.yaml", replay_flags=["--skip-checks"])
    opts = [shlex.split(line)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]
    for want in ("--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=8", "--cpus-per-task=64", "--partition=gpu",
                 "--account=proj 1", "--time=1-12:00:00", "--exclude=bad01", "--signal=B:USR1@180", "--requeue",
                 "--no-kill", "--output=/shared/me/runs/r 1/slurm-%j.out", "--chdir=/shared/me",
                 "--mail-type=END"):
        assert want in opts, (want, opts)
    last = script.strip().splitlines()[-1]
    assert last.startswith("exec ") and shlex.split(last)[1:] == [
        "/shared/venv/bin/python", "-m", "qwen_tui.cli", "replay", "/shared/me/runs/r 1/preset.submitted.yaml",
        "--runs-dir", "/shared/me/runs", "--run-id", "r 1", "--skip-checks"]
    # bash itself reads the script as written: its #SBATCH lines are comments, its body one exec
    assert subprocess.run(["bash", "-n"], input=script.encode()).returncode == 0


def test_a_cpu_run_asks_for_no_gpus_and_no_restarts_means_slurm_may_kill_the_job_on_a_node_failure():
    p = _preset(BASE.replace("restarts: 1", "device: cpu, restarts: 0"))
    opts = sbatch_options(p, run_dir="/r", job_name="j")
    assert not any(o.startswith("--gpus") for o in opts) and "--no-kill" not in opts


def test_slurm_records_and_node_states_are_read_as_scontrol_prints_them():
    line = ("JobId=42 JobName=qwen-tui-x UserId=me(1000) JobState=PENDING Reason=QOSMaxGRESPerUser "
            "Dependency=(null) Requeue=1 Restarts=2 BatchFlag=1 ExitCode=0:0 NodeList=(null) "
            "Command=/bin/sh -c x WorkDir=/shared/me with space")
    r = parse_record(line)
    assert r["JobState"] == "PENDING" and r["Reason"] == "QOSMaxGRESPerUser" and r["Restarts"] == "2"
    assert r["Command"] == "/bin/sh -c x" and r["WorkDir"] == "/shared/me with space"
    assert [node_gone(s) for s in ("DOWN", "DOWN*", "IDLE+DRAIN", "ALLOCATED", "MIXED+FAIL", "ALLOCATED*")] == \
        [True, True, False, False, True, False]


def test_the_export_of_a_slurm_preset_is_the_script_replay_submits_named_after_its_job(tmp_path):
    from qwen_tui.run.export.slurm_preset import exported_script

    p = _preset()
    exported = exported_script(p, preset_file="/shared/me/p.yaml", runs_root="/shared/me/runs")
    submitted = batch_script(p, run_dir="/shared/me/runs/r1", runs_root="/shared/me/runs", run_id="r1",
                             preset_file="/shared/me/p.yaml")
    differ = {a for a, b in zip(exported.splitlines(), submitted.splitlines()) if a != b}
    assert len(exported.splitlines()) == len(submitted.splitlines())
    assert {line.split("=")[0] if line.startswith("#SBATCH") else line.split()[0] for line in differ} <= \
        {"#SBATCH --job-name", "#SBATCH --output", "exec", "#"}, differ
    assert exported.strip().endswith('--run-id "qwen-tui-job-$SLURM_JOB_ID"')  # the batch shell expands it
    assert subprocess.run(["bash", "-n"], input=exported.encode()).returncode == 0
