"""The restart driver's decisions without training: a stopped run is not relaunched, a relaunch that cannot
keep the global batch is refused and recorded, and the node blamed for a failure is the one whose agent was
killed. Real local transports and run directories; the attempts' outcomes are given."""

from __future__ import annotations

import json
from pathlib import Path

from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.schema import Preset
from qwen_tui.run.launcher import Launcher, RunOutcome
from qwen_tui.run.recovery.restarts import Restarts, wait_for_next_attempt
from qwen_tui.run.rundir import RunDir
from qwen_tui.run.runs import attempt_note
from qwen_tui.run.states import JobState


def _launcher(tmp_path, gpus=(1, 1, 1), **training):
    preset = Preset.model_validate({
        "cluster": {"nodes": [{"host": "localhost", "gpus": g} for g in gpus]},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "zero_stage": None, "device": "cpu",
                     "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 2,
                     "gradient_accumulation_steps": 1, **training}})
    rd = RunDir.create(tmp_path / "runs", "r1")
    plan = make_plan(preset, run_id="r1", local_run_dir=str(rd.path), base_dir=str(tmp_path))
    transports = {i: LocalTransport(f"n{i}") for i in range(len(gpus))}
    la = Launcher(plan, transports, rd, stop_grace=1)
    rd.write_plan(plan)
    rd.write_state(status="running", started=1.0, attempt=1)
    return preset, la, rd


def _failed(la, rank, rc=137):
    st = la.nodes[rank]
    st.status, st.rc = JobState.FAILED, rc
    return RunOutcome("failed", f"node {rank} (localhost) failed: exited with code {rc}", rank, la.nodes)


def test_a_run_stopped_by_attach_is_not_relaunched(tmp_path):
    preset, la, rd = _launcher(tmp_path, restarts=3)
    said = []
    rs = Restarts(preset, la.transports, None, exclude_failed=False, base_dir=str(tmp_path), local_python=None,
                  say=said.append)

    def follow_one(a, left):
        rd.write_state(stop_requested=2.0)  # what attach --stop writes before it signals anything
        return _failed(a, 1)

    out = rs.follow(la, follow_one)
    assert out.status == "failed" and rs.made == 0
    state = json.loads((rd.path / "state.json").read_text())
    assert state["attempts"][0]["next"] == "none: the run was stopped (qwen-tui attach --stop)"
    assert said == ["not restarted: the run was stopped (qwen-tui attach --stop)"]
    assert wait_for_next_attempt(rd, 1, bound=2) is None


def test_a_global_batch_that_cannot_be_kept_refuses_the_relaunch_and_says_why(tmp_path):
    # 2 per device x 1 x 5 GPUs = 10; without node 1 there are 2 + 2 = 4 GPUs (10 is not a multiple of 4)
    preset, la, rd = _launcher(tmp_path, gpus=(2, 1, 2), restarts=1)
    said = []
    rs = Restarts(preset, la.transports, None, exclude_failed=True, base_dir=str(tmp_path), local_python=None,
                  say=said.append)
    calls = []

    def follow_one(a, left):
        calls.append(a)
        return _failed(a, 1)

    out = rs.follow(la, follow_one)
    assert len(calls) == 1 and out.failed_rank == 1
    why = "the global batch of 10 cannot be kept exactly on 4 GPUs"
    assert any(why in s for s in said), said
    state = json.loads((rd.path / "state.json").read_text())
    assert state["status"] == "failed" and state["attempt"] == 1
    assert why in state["attempts"][0]["restart_refused"] and state["attempts"][0]["next"].startswith("none: ")
    assert why in attempt_note(state)  # what `qwen-tui runs` shows
    assert not (rd.path / "preset.first.yaml").exists()  # nothing of a next attempt was written


def test_the_node_whose_agent_was_killed_is_blamed_not_the_peers_that_saw_it_go(tmp_path):
    _, la, rd = _launcher(tmp_path)
    logs = {0: "RuntimeError: Connection reset by peer\n", 1: "RuntimeError: Connection reset by peer\n",
            2: "Killed\n"}
    for c in la.plan.nodes:
        with open(c.log_path, "w") as f:
            f.write(logs[c.rank])
    for r in (0, 1):
        la.nodes[r].status, la.nodes[r].rc = JobState.FAILED, 1
    la.nodes[2].status, la.nodes[2].rc = JobState.FAILED, 137  # its torchrun agent died of SIGKILL
    st, diag, _ = la.culprit.find([la.nodes[0], la.nodes[1], la.nodes[2]])
    assert st.rank == 2 and diag.code == "KILLED"


def test_two_views_of_a_run_blame_the_node_the_first_one_saw_fail(tmp_path):
    # replay and an attach follow the same run; the attach saw node 2 fail first and stops the others, so
    # from replay's view node 0's job shell is gone without an exit code (lost). Both must blame node 2.
    _, first_view, rd = _launcher(tmp_path)
    for c in first_view.plan.nodes:
        with open(c.log_path, "w") as f:
            f.write("Killed\n" if c.rank == 2 else "")
    first_view.nodes[2].status, first_view.nodes[2].rc = JobState.FAILED, 137
    st, _, _ = first_view.culprit.agree(*first_view.culprit.find([first_view.nodes[2]]))
    assert st.rank == 2 and json.loads((rd.path / "state.json").read_text())["failing"] == {"attempt": 1, "rank": 2}

    second_view = Launcher(first_view.plan, first_view.transports, rd)
    second_view.nodes[0].status, second_view.nodes[0].error = JobState.LOST, "its processes were killed (no exit code)"
    assert second_view.culprit.find([second_view.nodes[0]])[0].rank == 0  # alone, it would blame node 0
    st, diag, _ = second_view.culprit.agree(*second_view.culprit.find([second_view.nodes[0]]))
    assert st.rank == 2 and diag.code == "KILLED"
    # a later attempt's failure is its own
    rd.write_state(attempt=2)
    third = Launcher(first_view.plan, first_view.transports, rd, attempt=2)
    third.nodes[1].status, third.nodes[1].rc = JobState.FAILED, 1
    assert third.culprit.agree(*third.culprit.find([third.nodes[1]]))[0].rank == 1


def test_a_node_whose_rank_torchrun_saw_die_of_sigkill_is_blamed(tmp_path):
    _, la, _ = _launcher(tmp_path)
    summary = ("Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 0)\n"
               "  exitcode  : -9 (pid: 8913)  (SIGKILL)\n  traceback : Signal 9 (SIGKILL) received by PID 8913\n")
    logs = {0: "RuntimeError: Connection reset by peer\n  exitcode  : 1 (pid: 9115)\n", 1: summary, 2: ""}
    for c in la.plan.nodes:
        with open(c.log_path, "w") as f:
            f.write(logs[c.rank])
    for r in (0, 1):
        la.nodes[r].status, la.nodes[r].rc = JobState.FAILED, 1  # both agents exit 1
    assert la.culprit.find([la.nodes[0], la.nodes[1]])[0].rank == 1


def test_the_metrics_of_a_relaunch_on_another_master_go_after_what_is_kept(tmp_path):
    from types import SimpleNamespace

    rd = RunDir.create(tmp_path / "runs", "m1")
    (rd.path / "metrics.jsonl").write_bytes(b"x" * 100)  # attempt 1's records, copied from its master
    old = SimpleNamespace(plan=SimpleNamespace(metrics_file="/w/.qwen-tui/runs/m1/metrics.jsonl"),
                          metrics=SimpleNamespace(keep_at=0))
    new = SimpleNamespace(metrics_file="/w/.qwen-tui/runs/m1/metrics.jsonl")  # the same path on another node
    assert Restarts._metrics_keep_at(rd, old, new, keep=[1, 2]) == 100  # node 0 left out: a new master
    assert Restarts._metrics_keep_at(rd, old, new, keep=[0, 1]) == 0  # the same master appends to its file
    old.metrics.keep_at = 100  # attempt 3 on attempt 2's master: where attempt 2's records went
    assert Restarts._metrics_keep_at(rd, old, new, keep=[0, 1]) == 100
    local = SimpleNamespace(metrics_file=str(rd.path / "metrics.jsonl"))
    assert Restarts._metrics_keep_at(rd, old, local, keep=[1]) == 0  # a local master writes the copy itself


def _write_keys(path: str, who: str, n: int) -> None:
    rd = RunDir(Path(path))
    for i in range(n):
        rd.write_state(**{f"{who}{i}": i})


def test_two_processes_updating_one_state_lose_no_key(tmp_path):
    import multiprocessing

    rd = RunDir.create(tmp_path / "runs", "s1")
    rd.write_state(status="running")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_keys, args=(str(rd.path), who, 150)) for who in ("replay", "attach")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    state = rd.read_state()
    missing = [f"{w}{i}" for w in ("replay", "attach") for i in range(150) if f"{w}{i}" not in state]
    assert not missing and state["status"] == "running", missing[:10]


def test_qwen_tui_runs_shows_the_attempt(tmp_path, capsys, monkeypatch):
    from qwen_tui.cli.main import main

    _, la, rd = _launcher(tmp_path, restarts=1)
    rd.write_state(status="running", attempt=2, restarts=1, attempts=[
        {"attempt": 1, "next": "restart"},
        {"attempt": 2, "excluded": ["gpu-7"], "resume_from": "out/checkpoint-40"}])
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["runs", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert "running (attempt 2)" in capsys.readouterr().out
    assert main(["runs", "--json", "--runs-dir", str(tmp_path / "runs")]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["state"] == "running" and row["attempt"] == 2
    assert row["attempt_note"] == "attempt 2 of 2; without gpu-7; resumed from out/checkpoint-40"
