"""bench/chaos_report.py: a fault's outcome from state.json's attempts and notices.jsonl, the steps trained again
after a relaunch from metrics.jsonl, and a checkpoint judged complete only as
training/checkpoints/checkpointer.py writes it
(real safetensors and torch files, then damaged ones)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from support.paths import ROOT


def _report():
    spec = importlib.util.spec_from_file_location("chaos_report", ROOT / "bench" / "chaos_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cr = _report()

# A run of three attempts: node 2 killed at t=150 (resumed from checkpoint-20 after step 27), a rank stopped at
# t=300 and named by the watchdog (resumed from checkpoint-40 after step 44), then an ok finish at step 60.
ATTEMPTS = [
    {"attempt": 1, "started": 100.0, "ended": 151.0, "status": "failed", "cause": None, "failed_rank": 2,
     "failed_node": "node2", "next": "restart", "resume_from": None},
    {"attempt": 2, "started": 160.0, "ended": 330.0, "status": "failed", "cause": "HANG", "failed_rank": 1,
     "failed_node": "node1", "next": "restart", "resume_from": "/out/checkpoint-20"},
    {"attempt": 3, "started": 340.0, "ended": 400.0, "status": "ok", "next": "none: the run ended ok",
     "resume_from": "/out/checkpoint-40"},
]


def _metrics():
    recs = [{"step": s, "loss": 1.0, "time": 100.0 + s} for s in range(1, 28)]  # attempt 1: steps 1..27
    recs += [{"step": s, "loss": 1.0, "time": 160.0 + s} for s in range(21, 45)]  # attempt 2: 21..44
    recs += [{"step": s, "loss": 1.0, "time": 340.0 + s} for s in range(41, 61)]  # attempt 3: 41..60
    recs += [{"event": "checkpoint", "step": 20, "path": "/out/checkpoint-20", "time": 121.0}]
    return recs


def test_a_killed_node_is_restarted_and_its_lost_steps_counted():
    fault = {"kind": "kill", "node": 2, "at": 150.0, "until": 170.0, "duration": 0.0, "detail": {}}
    outcome, ev = cr.classify(fault, ATTEMPTS, [])
    assert outcome == "restarted" and ev["attempt"] == 1 and ev["failed_node"] == "node2"
    lost = cr.steps_lost(ATTEMPTS, _metrics())
    assert lost == {2: 27 - 20, 3: 44 - 40}
    assert cr.every_step_once(ATTEMPTS, _metrics()) is None


def test_a_lost_machine_counts_as_named_only_when_its_attempt_ended_blaming_it_alone():
    fault = {"kind": "lost-silent", "node": 2, "at": 140.0, "until": 170.0, "duration": 20.0, "detail": {}}
    blamed = [{**ATTEMPTS[0], "cause": "MACHINE_LOST"}, *ATTEMPTS[1:]]
    assert cr.machine_named(fault, blamed) == 11.0
    assert cr.machine_named(fault, ATTEMPTS) is None  # ended, but not as a machine lost
    assert cr.machine_named({**fault, "node": 0}, blamed) is None  # a survivor blamed
    assert cr.justified(fault, 45.0) and cr.classify(fault, blamed, [])[0] == "restarted"


def test_a_record_missing_after_a_blip_is_found():
    recs = [r for r in _metrics() if r.get("step") != 50]
    assert "missing steps [50]" in cr.every_step_once(ATTEMPTS, recs)


def test_a_stopped_rank_counts_as_named_only_when_the_hang_names_its_node_and_rank():
    fault = {"kind": "hang", "node": 1, "at": 300.0, "until": 345.0, "duration": 30.0, "detail": {"rank": 1}}
    hang = {"kind": "HANG", "node": 1, "at": 325.0, "details": {"culprits": [1]}}
    assert cr.hang_named(fault, [hang])
    assert not cr.hang_named(fault, [{**hang, "node": 0, "details": {"culprits": [0]}}])
    assert not cr.hang_named(fault, [{**hang, "at": 299.0}])  # said before the rank was stopped
    assert cr.classify(fault, ATTEMPTS, [hang])[0] == "restarted"


def test_an_ssh_blip_warns_and_other_notices_in_its_window_are_not_its_answer():
    fault = {"kind": "ssh", "node": 0, "at": 200.0, "until": 250.0, "duration": 30.0, "detail": {}}
    notices = [{"kind": "UNREACHABLE", "node": 0, "at": 205.0}, {"kind": "REACHABLE", "node": 0, "at": 236.0},
               {"kind": "STRAGGLER", "node": 0, "at": 210.0}, {"kind": "UNREACHABLE", "node": 2, "at": 212.0}]
    outcome, ev = cr.classify(fault, ATTEMPTS, notices)
    assert outcome == "warned" and ev["notices"] == ["UNREACHABLE n0", "REACHABLE n0"]
    assert cr.unanswering([fault], notices) == {"STRAGGLER": 1, "UNREACHABLE": 1}
    quiet = {**fault, "at": 500.0, "until": 520.0}
    assert cr.classify(quiet, ATTEMPTS, notices)[0] == "survived unnoticed"


def test_only_a_fault_that_should_end_an_attempt_justifies_it():
    assert cr.justified({"kind": "kill", "duration": 0.0}, 45)
    assert cr.justified({"kind": "ssh", "duration": 50.0}, 45)
    assert not cr.justified({"kind": "ssh", "duration": 40.0}, 45)  # a blip under the bound must never end a run
    assert not cr.justified({"kind": "throttle", "duration": 30.0}, 45)
    assert not cr.justified(None, 45)


def _checkpoint(d: Path, step: int = 20, world: int = 3) -> Path:
    """A LoRA checkpoint with every file training/checkpoints/checkpointer.py writes for a run without DeepSpeed."""
    d.mkdir(parents=True)
    save_file({"base_model.model.lora_A.weight": torch.randn(8, 64)}, d / "adapter_model.safetensors")
    (d / "adapter_config.json").write_text("{}")
    (d / "tokenizer_config.json").write_text("{}")
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.randn(4))])
    torch.save(opt.state_dict(), d / "optimizer.pt")
    torch.save({"last_epoch": step}, d / "scheduler.pt")
    for r in range(world):
        torch.save({"cpu": torch.get_rng_state()}, d / f"rng_state_{r}.pth")
    (d / "finetune_state.json").write_text(json.dumps({"step": step, "world_size": world}))
    return d


def _load(p: Path):
    return torch.load(p, map_location="cpu", weights_only=True)


def test_a_complete_checkpoint_passes(tmp_path):
    assert cr.checkpoint_problem(_checkpoint(tmp_path / "checkpoint-20"), _load) is None


@pytest.mark.parametrize("damage, finding", [
    (lambda d: (d / "rng_state_2.pth").unlink(), "no rng_state_2.pth"),
    (lambda d: (d / "finetune_state.json").unlink(), "no finetune_state.json"),
    (lambda d: (d / "finetune_state.json").write_text(json.dumps({"step": 40, "world_size": 3})), "says step 40"),
    (lambda d: (d / "adapter_model.safetensors").write_bytes((d / "adapter_model.safetensors").read_bytes()[:-7]),
     "damaged adapter_model.safetensors"),
    (lambda d: (d / "optimizer.pt").write_bytes((d / "optimizer.pt").read_bytes()[:40]), "optimizer.pt does not load"),
])
def test_a_damaged_checkpoint_is_named(tmp_path, damage, finding):
    d = _checkpoint(tmp_path / "checkpoint-20")
    damage(d)
    assert finding in cr.checkpoint_problem(d, _load)


def test_the_checkpoints_a_run_names_come_from_its_records_and_its_resumes():
    names = cr.named_checkpoints(ATTEMPTS, _metrics())
    assert names == ["/out/checkpoint-20", "/out/checkpoint-40"]
    assert cr.check_checkpoints(["/nonexistent/checkpoint-3"]) == {"/nonexistent/checkpoint-3": "missing"}


def test_totals_and_table():
    faults = [{"kind": "hang", "node": 1, "run": "1", "run_no": "1", "at": 300.0, "at_s": 75.0, "until": 345.0,
               "duration": 30.0, "detail": {"rank": 1, "hang_after_s": 31.0}, "outcome": "restarted",
               "evidence": {"notices": ["HANG n1"], "cause": "HANG"}, "named": True, "steps_lost": 4}]
    runs = [{"run": 1, "status": "ok", "checkpoints": {"/out/checkpoint-20": None, "/out/checkpoint-40": "missing"},
             "orphans": {}, "healthy_killed": [], "unexplained": [], "unanswering": {"STRAGGLER": 2}}]
    t = cr.totals(faults, runs, 45)
    assert (t["hangs_injected"], t["hangs_named"], t["steps_lost"], t["checkpoints_intact"]) == (1, 1, 4, 1)
    assert t["notices_answering_no_fault"] == {"STRAGGLER": 2}
    table = cr.text_table(faults, {"1": runs[0]})
    assert "named rank 1 after 31 s; attempt ended: HANG" in table and "1/2" in table and "1:15" in table


def test_the_stacks_a_hang_collected_are_counted_from_its_summary(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"0": "ok (SIGUSR1)", "1": "did not answer SIGUSR1 "
                                                       "(process stopped: state T)", "2": "ok (py-spy)"}))
    assert cr.stacks_answered(tmp_path) == "2/3"
    assert cr.stacks_answered(tmp_path / "none") is None


def test_a_hang_not_named_says_which_phase_the_other_ranks_waited_in():
    fault = {"kind": "hang", "node": 1, "run": "1", "run_no": "1", "at": 10.0, "at_s": 10.0, "until": 140.0,
             "duration": 125.0, "detail": {"rank": 1, "phases": {"0": "checkpoint", "1": "forward", "2": "checkpoint"}},
             "outcome": "survived unnoticed", "evidence": {"notices": []}, "named": False, "steps_lost": 0}
    table = cr.text_table([fault], {})
    assert "NOT named rank 1 (the others in phase checkpoint)" in table


def test_a_fault_explains_the_attempt_it_ended_not_the_relaunches_that_failed_after_it():
    fault = {"kind": "ssh", "node": 1, "at": 100.0, "until": 300.0, "duration": 56.0, "detail": {}}
    attempts = [
        {"attempt": 1, "started": 0.0, "ended": 150.0, "status": "failed", "cause": "UNREACHABLE", "next": "restart"},
        {"attempt": 2, "started": 151.0, "ended": 170.0, "status": "failed", "cause": None, "next": "restart",
         "message": "node 0 (node0) failed: exited with code 1"},
        {"attempt": 3, "started": 171.0, "ended": 190.0, "status": "failed", "cause": None,
         "next": "none: no restart left (training.restarts: 2)", "message": "node 0 (node0) failed: exited with code 1"},
    ]
    outcome, ev = cr.classify(fault, attempts, [])
    assert outcome == "failed" and ev["later_attempts_failed"] == [2, 3]
    healthy, other = cr.failures_unexplained([fault], attempts, 45, first=8)
    assert healthy == [] and [(u["attempt"], u["fault"]) for u in other] == [(2, 8), (3, 8)]
    short = {**fault, "duration": 30.0}  # under the bound: the monitor ended a healthy attempt
    healthy, _ = cr.failures_unexplained([short], attempts[:1], 45)
    assert [h["attempt"] for h in healthy] == [1]
