"""SLURM as qwen-tui's backend, on a real SLURM (Debian's slurm-wlm and munge: slurmctld on node 0, a slurmd per
namespace node), as a login user: a run submitted from the login node (this machine) pends while another job
holds the nodes, then trains to COMPLETED; a run inside an salloc allocation is checked and launched through
srun; scancel from outside ends a run as CANCELLED with nothing left; a node SLURM sets DOWN is named and the run
resumes without it; SLURM's time-limit warning saves a checkpoint and the requeued job resumes from it; `check`
of a SLURM preset finds what it finds over SSH."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from support.field_run import records, steps_of
from support.login_user import UID
from support.slurm import slurm_preset, user_pids


@pytest.fixture(autouse=True)
def idle_nodes(slurm):
    """Every test starts with every node idle: an earlier one's jobs ended, a node it set DOWN back."""
    slurm.wait_all_idle()


def _job_of(rd: Path) -> str:
    return json.loads((rd / "slurm.json").read_text())["job_id"]


def _state(slurm, job: str) -> dict:
    out = slurm.client("scontrol", "show", "job", "-o", job).stdout
    return dict(re.findall(r"(\S+?)=(\S*)", out))


def _nothing_left(cluster, bound: float = 60.0) -> dict:
    """{} once no process of the login user is left on any node; else what is there at the bound."""
    deadline = time.monotonic() + bound
    left = user_pids(cluster, UID)
    while left and time.monotonic() < deadline:
        time.sleep(0.3)
        left = user_pids(cluster, UID)
    return left


def test_a_submitted_run_pends_behind_another_job_then_trains_to_completed(cluster, slurm, field, tmp_path):
    blocker = slurm.client("sbatch", "--parsable", "-N3", "--exclusive", "--job-name=other-users-job",
                           "--output=/dev/null", "--wrap", "sleep 600").stdout.strip()  # no slurm-N.out in the cwd
    rp = field.replay(slurm_preset(field, "submitted"), tmp_path / "replay.log", env=slurm.env)
    try:
        rp.wait_for("PENDING with SLURM's reason", lambda: re.search(r"PENDING \((Resources|Priority)\)", rp.text()),
                    60)
        slurm.client("scancel", blocker)
        assert rp.finish(300) == 0, rp.text()[-4000:]
    finally:
        slurm.client("scancel", blocker, check=False)
        rp.close()
    text = rp.text()
    rd = next(rp.runs.glob("*/slurm.json")).parent
    job = _job_of(rd)
    assert f"job {job} RUNNING on 3 node(s): node0, node1, node2" in text
    assert "training finished on every node" in text and f"job {job} COMPLETED" in text
    # SLURM's own record of the job says what qwen-tui says
    assert "JobState=COMPLETED" in slurm.completion(job), slurm.completion(job)
    assert _state(slurm, job)["JobState"] == "COMPLETED"
    state = json.loads((rd / "state.json").read_text())
    assert state["status"] == "ok" and state["slurm"]["state"] == "COMPLETED"
    steps = [r for r in records(rd / "metrics.jsonl") if "loss" in r and "event" not in r]
    assert [r["step"] for r in steps] == list(range(1, 7)) and steps[-1]["loss"] < steps[0]["loss"]
    plan = json.loads((rd / "plan.json").read_text())
    assert [n["host"] for n in plan["nodes"]] == ["node0", "node1", "node2"]  # the nodes SLURM chose
    assert _nothing_left(cluster) == {}


def test_inside_an_allocation_every_check_and_step_runs_through_srun(cluster, slurm, field, tmp_path):
    rp = field.replay(slurm_preset(field, "allocated"), tmp_path / "replay.log", env=slurm.env,
                      prefix=("salloc", "-N3", "--cpus-per-task=1"))
    try:
        assert rp.finish(300) == 0, rp.text()[-4000:]
    finally:
        rp.close()
    text = rp.text()
    job = re.search(r"inside SLURM job (\d+): 3 node\(s\), node0, node1, node2", text)
    assert job, text[-3000:]
    for i in range(3):  # every node probed and rehearsed, through srun (no SSH between them here)
        assert f"probe: node {i} (node{i}): probed" in text
        assert f"rehearsal: node {i} (node{i}): passed" in text
    assert "training finished on every node" in text
    assert "JobState=COMPLETED" in slurm.completion(job.group(1))
    assert _nothing_left(cluster) == {}


def test_scancel_from_outside_ends_the_run_cancelled_with_nothing_left(cluster, slurm, field, tmp_path):
    rp = field.replay(slurm_preset(field, "cancelled", max_steps=400), tmp_path / "replay.log", "--skip-checks",
                      env=slurm.env)
    try:
        rd = rp.wait_for("the run directory", lambda: next(rp.runs.glob("*/slurm.json"), None), 60).parent
        job = _job_of(rd)
        rp.wait_for("step 2", lambda: (s := steps_of(field.shared / "cancelled-work" / ".qwen-tui" / "runs" /
                                                    rd.name / "metrics.jsonl")) and s[-1] >= 2, 240)
        ranks = user_pids(cluster, UID)
        assert sorted(ranks) == [0, 1, 2], ranks  # the login user's processes train on every node
        slurm.client("scancel", job)  # from outside, as an administrator or another terminal would
        code = rp.finish(120)
    finally:
        rp.close()
    text = rp.text()
    assert code == 130, text[-3000:]
    assert f"job {job} CANCELLED" in text
    assert json.loads((rd / "state.json").read_text())["status"] == "stopped"
    assert _state(slurm, job)["JobState"] == "CANCELLED"
    assert _nothing_left(cluster) == {}


def test_a_node_set_down_is_named_and_the_run_resumes_from_its_checkpoint_without_it(cluster, slurm, field,
                                                                                       tmp_path):
    preset = slurm_preset(field, "nodedown", max_steps=40, save_strategy="steps", save_steps=3, restarts=1,
                          exclude_failed=True)
    rp = field.replay(preset, tmp_path / "replay.log", "--skip-checks", env=slurm.env)
    out = field.shared / "nodedown-out"
    try:
        rp.wait_for("checkpoint-3", lambda: (out / "checkpoint-3").is_dir(), 240)
        slurm.client("scontrol", "update", "nodename=node2", "state=down", "reason=qt-test-failure")
        code = rp.finish(300)
    finally:
        slurm.client("scontrol", "update", "nodename=node2", "state=resume", check=False)
        rp.close()
    text = rp.text()
    assert code == 0, text[-4000:]
    assert re.search(r"node 2 \(node2\).*DOWN", text), text[-4000:]
    assert re.search(r"attempt 2: 2 node\(s\).*from .*checkpoint-(3|6)", text), text[-4000:]
    rd = next(rp.runs.glob("*/slurm.json")).parent
    state = json.loads((rd / "state.json").read_text())
    assert state["status"] == "ok" and state["attempts"][0]["failed_node"] == "node2", state["attempts"]
    assert state["attempts"][1]["nodes"] == ["node0", "node1"]
    assert "JobState=COMPLETED" in slurm.completion(_job_of(rd))
    assert _nothing_left(cluster) == {}


def test_the_time_limit_warning_saves_a_checkpoint_and_the_requeued_job_resumes_from_it(cluster, slurm, field,
                                                                                         tmp_path):
    preset = slurm_preset(field, "timelimit", max_steps=24, scheduler={"time": "00:30:00", "warn_before_end": 600})
    rp = field.replay(preset, tmp_path / "replay.log", "--skip-checks", env=slurm.env)
    out = field.shared / "timelimit-out"
    try:
        rd = rp.wait_for("the run directory", lambda: next(rp.runs.glob("*/slurm.json"), None), 60).parent
        job = _job_of(rd)
        live = field.shared / "timelimit-work" / ".qwen-tui" / "runs" / rd.name / "metrics.jsonl"
        rp.wait_for("step 3", lambda: (s := steps_of(live)) and s[-1] >= 3, 240)
        # SLURM's --signal=B:USR1@N warning, delivered now rather than N seconds before the limit: the same
        # signal to the same process (the batch shell, which is the job's qwen-tui)
        slurm.client("scancel", "--batch", "--signal=USR1", job)
        rp.wait_for("the requeued job pending", lambda: re.search(rf"job {job} PENDING \(BeginTime\)", rp.text()), 120)
        saved = [r for r in records(live) if r.get("event") == "checkpoint"]
        # SLURM holds a requeued job 2 minutes, for its nodes to finish the run before: the test ends the hold
        # early, but only once they have (every node idle), or the next run could start beside the last one's end
        slurm.wait_all_idle(90)
        slurm.client("scontrol", "update", f"jobid={job}", "StartTime=now")
        code = rp.finish(300)
    finally:
        rp.close()
    text = rp.text()
    log = (rd / f"slurm-{job}.out").read_text(errors="replace")  # both attempts' batch shells
    assert code == 0, (text[-2500:] + "\n--- the job's own output ---\n" + log[-4000:]
                       + "\n--- slurmctld ---\n" + slurm.log_tail("slurmctld.log", 40))
    assert len(saved) == 1 and (out / f"checkpoint-{saved[0]['step']}").is_dir(), saved
    k = saved[0]["step"]
    assert "asked 1 rank(s)" in log and f"requeueing SLURM job {job}" in log, log[-3000:]
    assert "attempt 2 resumes from the newest checkpoint" in log, log[-3000:]
    assert f"checkpoint-{k}" in log  # the worker says which checkpoint it resumed from
    steps = steps_of(rd / "metrics.jsonl")
    assert steps[-1] == 24 and steps.count(k + 1) == 1, steps  # resumed after k, not from the start
    info = _state(slurm, job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", info
    assert _nothing_left(cluster) == {}


# a measurement's verdict, which two runs of the same check on loaded namespaces need not share
MEASURED = {"LOW_BANDWIDTH"}


def _findings(path: Path) -> set[tuple[str, str, str]]:
    rep = json.loads(path.read_text())
    labels = rep["labels"]
    return {(f["level"], f["code"], labels[f["node"]] if f.get("node") is not None else "cluster")
            for f in rep["findings"] if f["level"] in ("error", "warning") and f["code"] not in MEASURED}


def test_check_of_a_slurm_preset_finds_what_it_finds_over_ssh(cluster, slurm, field, tmp_path):
    # node 1 cannot reach the master's port (a firewall on node 0 refuses it), on either path to the nodes
    rule = ["INPUT", "-s", cluster.nodes[1].addr, "-p", "tcp", "-m", "multiport", "--dports", "29500,29541",
            "-j", "REJECT"]
    cluster.ns(0, "iptables", "-I", *rule)
    try:
        over_ssh = field.shared / "check-ssh.json"  # where the login user may write
        field.qwen_tui(tmp_path / "ssh.log", "check", str(field.preset("checked")), "--no-rehearsal", "--out",
                       str(over_ssh), bound=180)
        over_slurm = field.shared / "check-slurm.json"
        # the login user's PATH as sshd gives it (srun passes the client's environment on to the nodes)
        text = field.qwen_tui(tmp_path / "slurm.log", "check", str(slurm_preset(field, "checked-slurm")),
                              "--no-rehearsal", "--out", str(over_slurm), bound=240,
                              env={**slurm.env, "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/games"})
    finally:
        cluster.ns(0, "iptables", "-D", *rule, check=False)
    assert "asking for one to check (3 node(s)" in text and "srun" in text, text[-3000:]
    ssh, srun = _findings(over_ssh), _findings(over_slurm)
    assert ("error", "MASTER_PORT_UNREACHABLE", "node1") in ssh, ssh
    assert srun == ssh, (srun, ssh)


def test_a_pyxis_preset_on_nodes_whose_srun_lacks_pyxis_is_refused_naming_each_node(cluster, slurm, field,
                                                                                   tmp_path):
    # This SLURM has no pyxis (no Debian build of it): the check, run on each node through srun, must say so
    # before anything starts, with the fix, rather than fail at the first container step.
    path = slurm_preset(field, "pyxis")
    d = yaml.safe_load(path.read_text())
    d["container"] = {"runtime": "pyxis", "image": str(field.shared / "qwen-tui.sqsh")}
    path.write_text(yaml.safe_dump(d))
    out = field.shared / "check-pyxis.json"
    text = field.qwen_tui(tmp_path / "pyxis.log", "check", str(path), "--no-rehearsal", "--out", str(out),
                          bound=240, env={**slurm.env, "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/games"})
    rep = json.loads(out.read_text())
    missing = [f for f in rep["findings"] if f["code"] == "CONTAINER_RUNTIME_MISSING"]
    assert sorted(rep["labels"][f["node"]] for f in missing) == ["node0", "node1", "node2"], text[-3000:]
    assert all("srun there has no --container-image" in f["message"] and "plugstack.conf" in f["fix"]
               for f in missing), missing
    assert not any(f["code"] == "PROBE_FAILED" for f in rep["findings"])  # nothing tried to start in it
    assert _nothing_left(cluster) == {}
