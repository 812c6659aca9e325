"""Recovery (run/recovery/attempts.py): the batch re-split without a failed node, the checkpoint every node holds,
when a failure is relaunched, and the preset fields that ask for it."""

from __future__ import annotations

import pytest

from qwen_tui.cli.main import main
from qwen_tui.plan.launch import make_plan, worker_args
from qwen_tui.preset.files import parse_preset
from qwen_tui.preset.schema import Preset, PresetError
from qwen_tui.run.recovery.attempts import (
    BatchFit,
    RestartRefused,
    common_checkpoint,
    recovery_notes,
    refit_batch,
    why_not_restart,
    without_nodes,
)
from qwen_tui.run.runs import attempt_note


def preset(gpus=(1, 1, 1), micro=2, accum=1, **training) -> Preset:
    return Preset.model_validate({
        "cluster": {"nodes": [{"host": f"n{i}", "gpus": g} for i, g in enumerate(gpus)]},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "zero_stage": None,
                     "per_device_train_batch_size": micro, "gradient_accumulation_steps": accum, **training},
    })


@pytest.mark.parametrize("global_batch, micro, world, want", [
    (12, 2, 2, (2, 3)),    # the per-device batch stays when it divides the new share
    (6, 2, 2, (1, 3)),     # 3 records per process: 2 does not divide it, 1 x 3 does
    (64, 4, 6, None),      # 64 is not a multiple of 6
    (16, 8, 1, (8, 2)),
    (48, 4, 3, (4, 4)),
    (8, 1, 8, (1, 1)),
])
def test_refit_keeps_the_global_batch_with_the_largest_per_device_batch_allowed(global_batch, micro, world, want):
    if want is None:
        with pytest.raises(RestartRefused) as e:
            refit_batch(global_batch, micro, world)
        assert "cannot be kept exactly" in str(e.value) and "60 or 66" in str(e.value), str(e.value)
        return
    fit = refit_batch(global_batch, micro, world)
    assert (fit.per_device, fit.accumulation) == want
    assert fit.global_batch == global_batch and fit.per_device <= micro
    assert fit.describe() == f"{want[0]} per device x {want[1]} accumulation x {world} GPUs = {global_batch}"


def test_refit_refuses_an_accumulation_over_the_presets_limit():
    with pytest.raises(RestartRefused, match="4097 accumulation steps, above the limit of 4096"):
        refit_batch(4097, 1, 1)


def test_without_a_failed_node_the_batch_is_resplit_and_the_preset_is_untouched():
    p = preset(gpus=(2, 2, 4), micro=2, accum=2)  # 2 x 2 x 8 GPUs = 32
    new, fit = without_nodes(p, {2}, resuming=True)
    assert [n.host for n in new.cluster.nodes] == ["n0", "n1"]
    assert new.world_size == 4 and new.effective_batch_size == p.effective_batch_size == 32
    assert (new.training.per_device_train_batch_size, new.training.gradient_accumulation_steps) == (2, 4)
    assert fit == BatchFit(4, 2, 4)
    assert len(p.cluster.nodes) == 3 and p.training.gradient_accumulation_steps == 2  # a copy was changed
    # the plan of the relaunch says the same
    plan = make_plan(new, run_id="r", local_run_dir="/tmp/r")
    assert plan.world_size == 4 and plan.effective_batch_size == 32 and plan.nnodes == 2
    args = plan.nodes[0].argv
    assert args[args.index("--gradient_accumulation_steps") + 1] == "4"


def test_a_global_batch_that_cannot_be_kept_is_said_with_the_numbers():
    p = preset(gpus=(1, 1, 1), micro=2, accum=2)  # 12 over 3 GPUs; without two of them: 12 over 1 works
    assert without_nodes(p, {1, 2}, resuming=True)[1] == BatchFit(1, 2, 6)
    p = preset(gpus=(2, 2, 1), micro=1, accum=1)  # 5 over 4 GPUs
    with pytest.raises(RestartRefused) as e:
        without_nodes(p, {2}, resuming=False)
    assert "global batch of 5 cannot be kept exactly on 4 GPUs" in str(e.value)


def test_the_master_with_a_fixed_address_cannot_be_left_out():
    d = preset().model_dump()
    d["network"]["master_addr"] = "10.0.0.1"
    with pytest.raises(RestartRefused) as e:
        without_nodes(Preset.model_validate(d), {0}, resuming=True)
    assert "network.master_addr (10.0.0.1)" in str(e.value) and "n1" in str(e.value)
    # without a fixed address the next node becomes the master
    new, _ = without_nodes(preset(gpus=(1, 1), micro=2, accum=1), {0}, resuming=True)
    assert new.master_addr == "n1"


def zero_preset(shared: bool, hosts=("n0", "n1"), **training) -> Preset:
    d = preset(gpus=(1,) * len(hosts), micro=2, accum=1, restarts=1, **training).model_dump()
    d["cluster"]["nodes"] = [{"host": h, "gpus": 1} for h in hosts]
    d["cluster"]["shared_storage"] = shared
    return Preset.model_validate(d)


@pytest.mark.parametrize("stage, method", [(2, "lora"), (2, "full"), (3, "lora"), (3, "full")])
def test_zero_state_resumes_on_fewer_processes_from_shared_storage(stage, method):
    """The worker converts the checkpoint to DeepSpeed's universal format (tests/training/test_resume_other_world.py
    shows the curve going on): a failed node can be left out after the first checkpoint too."""
    p = zero_preset(True, zero_stage=stage, method=method)
    new, fit = without_nodes(p, {1}, resuming=True)
    assert new.world_size == 1 and fit == BatchFit(1, 2, 2) and new.training.zero_stage == stage
    assert recovery_notes(p, exclude_failed=True) == []
    # nodes all on this machine see one output_dir, as the plan knows (no --save_on_each_node)
    assert without_nodes(zero_preset(False, hosts=("localhost", "localhost"), zero_stage=stage, method=method),
                         {1}, resuming=True)[0].world_size == 1


@pytest.mark.parametrize("shared, training, why", [
    (False, {}, "without shared storage each node keeps only its own ranks' ZeRO slices"),
    (True, {"offload": "optimizer"}, "offloaded optimizer state (offload: optimizer)"),
    (True, {"method": "qlora"}, "Q-LoRA under ZeRO"),
])
def test_zero_state_that_cannot_be_resumed_on_fewer_processes_is_refused_with_why(shared, training, why):
    p = zero_preset(shared, zero_stage=2, **training)
    with pytest.raises(RestartRefused) as e:
        without_nodes(p, {1}, resuming=True)
    msg = str(e.value)
    assert msg.startswith("DeepSpeed ZeRO-2 optimizer state saved by 2 processes cannot be resumed on 1 here: ")
    assert why in msg and "relaunch on the same nodes" in msg, msg
    assert any(why in n and "only before the first checkpoint" in n for n in recovery_notes(p, exclude_failed=True))
    assert without_nodes(p, {1}, resuming=False)[0].world_size == 1  # nothing to resume: any world size
    with pytest.raises(RestartRefused, match="no node is left"):
        without_nodes(p, {0, 1}, resuming=False)


def test_the_checkpoint_is_the_newest_every_node_holds():
    assert common_checkpoint({0: ["checkpoint-4", "checkpoint-8"], 1: ["checkpoint-8", "checkpoint-4"]}) == 8
    # node 1 died while publishing 8: it has only the staging directory
    assert common_checkpoint({0: ["checkpoint-4", "checkpoint-8"], 1: ["checkpoint-4", "checkpoint-8.tmp"]}) == 4
    assert common_checkpoint({0: ["checkpoint-4"], 1: []}) is None
    assert common_checkpoint({0: ["merged", "adapter_model.safetensors"]}) is None


def test_which_failures_are_relaunched():
    assert why_not_restart("failed", 2, "CONN_RESET", 0, 1) is None
    assert why_not_restart("failed", 2, None, 1, 2) is None
    assert "no restart left (training.restarts: 1)" in why_not_restart("failed", 2, None, 1, 1)
    assert "training.restarts is 0" in why_not_restart("failed", 2, None, 0, 0)
    assert why_not_restart("stopped", None, None, 0, 3) == "the run ended stopped"
    assert why_not_restart("ok", None, None, 0, 3) == "the run ended ok"
    assert "MODULE_MISSING" in why_not_restart("failed", 1, "MODULE_MISSING", 0, 3)
    assert "no node failed" in why_not_restart("failed", None, None, 0, 3)


def test_attempt_note_reads_the_attempts_of_state_json():
    assert attempt_note({}) is None
    assert attempt_note({"restarts": 1, "attempts": [{"attempt": 1}]}) is None
    state = {"restarts": 1, "attempts": [
        {"attempt": 1, "next": "restart"},
        {"attempt": 2, "excluded": ["node2"], "resume_from": "out/checkpoint-4",
         "batch": "1 per device x 3 accumulation x 2 GPUs = 6"}]}
    assert attempt_note(state) == ("attempt 2 of 2; without node2; resumed from out/checkpoint-4; "
                                   "batch 1 per device x 3 accumulation x 2 GPUs = 6")
    # the failed attempt's node and cause, when state.json has them (run/recovery/restarts.py records them)
    state["attempts"][0].update(failed_rank=1, failed_node="node2", cause="NCCL_TIMEOUT")
    assert attempt_note(state).startswith("attempt 2 of 2; after node 1 (node2) failed (NCCL_TIMEOUT); without node2;")
    state["attempts"][0]["cause"] = None
    assert "; after node 1 (node2) failed; " in attempt_note(state)


def test_restarts_and_exclude_failed_in_the_preset(tmp_path, capsys):
    text = ("cluster: {nodes: [{host: localhost}]}\n"
            "training: {model: builtin:tiny, data: builtin:demo-chat, restarts: 2, exclude_failed: true}\n")
    p = parse_preset(text)
    assert (p.training.restarts, p.training.exclude_failed) == (2, True)
    assert preset().training.restarts == 0 and preset().training.exclude_failed is False
    # qwen-tui's own fields: the worker never sees them
    assert not any("restart" in a or "exclude" in a for a in worker_args(p.training, metrics_file="m"))
    with pytest.raises(PresetError) as e:
        parse_preset(text.replace("restarts: 2", "restarts: -1"), "bad.yaml")
    assert e.value.problems == ["bad.yaml:2 training.restarts: Input should be greater than or equal to 0, got -1"]
    # the way users meet it: a non-zero exit and the field named, nothing else
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("restarts: 2", "restarts: -1"))
    assert main(["replay", str(bad), "--dry-run", "--exclude-failed"]) == 2
    err = capsys.readouterr().err
    assert "training.restarts" in err and "greater than or equal to 0" in err
    with pytest.raises(PresetError, match="training.exclude_failed"):
        parse_preset(text.replace("exclude_failed: true", "exclude_failed: maybe"))


def test_recovery_settings_that_cannot_do_what_they_suggest_are_said_before_launch():
    assert recovery_notes(preset(restarts=2, save_strategy="steps"), exclude_failed=True) == []
    assert recovery_notes(preset(), exclude_failed=False) == []
    (n,) = recovery_notes(preset(), exclude_failed=True)
    assert "--exclude-failed does nothing with training.restarts: 0" in n
    (n,) = recovery_notes(preset(restarts=1, save_strategy="no"), exclude_failed=False)
    assert "save_strategy is no" in n and "starts over from step 0" in n
    (n,) = recovery_notes(preset(restarts=1, zero_stage=3), exclude_failed=True)
    assert "ZeRO-3" in n and "before the first checkpoint" in n
