"""A run's and its nodes' states: named once, written and read back as the words they always were."""

import json

from qwen_tui.run.launcher import NodeState, RunOutcome
from qwen_tui.run.rundir import RunDir
from qwen_tui.run.states import FINAL, JobState, RunState


def test_exit_codes_of_the_ended_states():
    assert [s.exit_code for s in FINAL] == [0, 1, 130, 1]  # ok, failed, stopped, lost
    assert RunOutcome("stopped", "stopped by request").exit_code == 130
    assert RunOutcome(RunState.FAILED, "x").exit_code == 1


def test_an_outcome_given_a_word_holds_the_state():
    out = RunOutcome("ok", "training finished on every node")
    assert out.status is RunState.OK and f"{out.status}: {out.message}".startswith("ok: ")
    assert NodeState(0, "a").status is JobState.PENDING and not JobState.PENDING.ended and JobState.LOST.ended


def test_state_json_keeps_the_words(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir(parents=True)
    rd.write_state(status=RunState.RESTARTING)
    assert json.loads((rd.path / "state.json").read_text())["status"] == "restarting"
    assert rd.read_state()["status"] == RunState.RESTARTING
