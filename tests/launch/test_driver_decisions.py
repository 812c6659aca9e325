"""Taking a run over without training: Restarts.from_run_dir restores what the launching face knew (the preset,
facts keyed by the current attempt's ranks, exclude_failed, the restarts allowed and made, the nodes left out,
where it planned from), and take_over says so and goes through the same decisions as the launching face.
Real local transports and run directories; the attempts' outcomes are given."""

from __future__ import annotations

import json

from qwen_tui.cluster.facts import ClusterFacts, NodeFacts
from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.files import save_preset
from qwen_tui.preset.schema import Preset
from qwen_tui.run.launcher import Launcher, RunOutcome
from qwen_tui.run.recovery import driver
from qwen_tui.run.recovery.restarts import Restarts
from qwen_tui.run.rundir import RunDir, write_json_atomic
from qwen_tui.run.states import JobState


def _second_attempt(tmp_path, restarts: int):
    """A run on its second attempt: node b was left out after attempt 1, nodes a, c, d stay (2, 1, 2 GPUs)."""
    preset = Preset.model_validate({
        "cluster": {"nodes": [{"host": "localhost", "name": n, "gpus": g} for n, g in (("a", 2), ("c", 1), ("d", 2))]},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "zero_stage": None, "device": "cpu",
                     "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 2,
                     "gradient_accumulation_steps": 1, "restarts": restarts}})
    rd = RunDir.create(tmp_path / "runs", "r1")
    save_preset(preset, rd.path / "preset.yaml", mode=0o600)
    # facts.json is the first launch's: ranks of a, b, c, d
    write_json_atomic(rd.path / "facts.json", ClusterFacts(nodes={
        r: NodeFacts(hostname=f"host-{n}", cpu_count=r + 1) for r, n in enumerate("abcd")}).to_dict())
    plan = make_plan(preset, run_id="r1", local_run_dir=str(rd.path), base_dir=str(tmp_path))
    la = Launcher(plan, {i: LocalTransport(f"n{i}") for i in range(3)}, rd, stop_grace=1, attempt=2)
    rd.write_plan(plan)
    rd.write_state(status="running", started=1.0, attempt=2, restarts=restarts, exclude_failed=True,
                   relaunch={"base_dir": "/where/replay/ran", "local_python": "/usr/bin/python3"},
                   attempts=[{"attempt": 1, "nodes": ["a", "b", "c", "d"], "excluded": [], "next": "restart",
                              "status": "failed", "failed_rank": 1, "failed_node": "b"},
                             {"attempt": 2, "nodes": ["a", "c", "d"], "excluded": ["b"], "resume_from": None}])
    return la, rd


def _failed(la, rank, rc=137):
    la.nodes[rank].status, la.nodes[rank].rc = JobState.FAILED, rc
    return RunOutcome("failed", f"node {rank} failed: exited with code {rc}", rank, la.nodes)


def test_what_the_launching_face_knew_is_restored_from_the_run_directory(tmp_path):
    la, rd = _second_attempt(tmp_path, restarts=3)
    rs = Restarts.from_run_dir(la, say=lambda s: None)
    assert (rs.allowed, rs.made, rs.excluded, rs.exclude_failed) == (3, 1, ["b"], True)
    assert (rs.base_dir, rs.local_python) == ("/where/replay/ran", "/usr/bin/python3")
    assert [n.label for n in rs.preset.cluster.nodes] == ["a", "c", "d"]
    # the facts of a, c, d under this attempt's ranks 0, 1, 2 (b's are not anyone's)
    assert {r: f.hostname for r, f in rs.facts.nodes.items()} == {0: "host-a", 1: "host-c", 2: "host-d"}
    assert rs.transports is la.transports


def test_a_take_over_says_so_and_decides_as_the_launching_face_would(tmp_path):
    la, rd = _second_attempt(tmp_path, restarts=3)
    assert driver.claim(rd)
    said = []
    rs = Restarts.from_run_dir(la, say=said.append)
    calls = []
    # without node c (rank 1) 4 GPUs are left: the global batch of 10 cannot be kept, the relaunch is refused
    out = rs.take_over(la, _failed(la, 1), lambda a, left: calls.append(a))
    assert out.failed_rank == 1 and calls == []
    assert said[0] == "the face that launched this run is gone: attach relaunches it (attempt 3 of 4)", said
    assert any("the global batch of 10 cannot be kept exactly on 4 GPUs" in s for s in said), said
    state = json.loads((rd.path / "state.json").read_text())
    a2 = state["attempts"][-1]
    assert a2["status"] == "failed" and a2["next"].startswith("none: ") and state["status"] == "failed"
    assert state["driver"] is None  # the face that took over ended its record when it returned


def test_a_take_over_with_no_restart_left_relaunches_nothing(tmp_path):
    la, rd = _second_attempt(tmp_path, restarts=1)
    said = []
    out = Restarts.from_run_dir(la, say=said.append).take_over(la, _failed(la, 2), lambda a, left: None)
    assert out.status == "failed"
    assert said == ["not restarted: no restart left (training.restarts: 1)"], said  # and no word of a relaunch
    assert json.loads((rd.path / "state.json").read_text())["attempts"][-1]["next"].startswith("none: ")
