"""FP8 in the core: the preset's training.fp8, the worker's --fp8 in the plan's argv, the estimate's FP8 factor
(the ratios measured through the worker, by the worker's own rule) and the FP8 advice the wizard's Training step
shows."""

from __future__ import annotations

import json

import pytest

from qwen_tui.advice.rules import advise, apply_fix
from qwen_tui.cluster.facts import GPU, ClusterFacts, NodeFacts
from qwen_tui.model.spec import known_spec
from qwen_tui.plan import estimate as est
from qwen_tui.plan import estimate_time as est_time
from qwen_tui.plan.launch import worker_args
from qwen_tui.preset.files import dump_preset, parse_preset
from qwen_tui.preset.schema import Preset, PresetError
from support.paths import ROOT

SEVEN_B, ONE_FIVE_B = "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"
H100 = "NVIDIA H100 80GB HBM3"


def preset(nodes=1, gpus=8, **training):
    t = dict(model=SEVEN_B, data="/data/chat.jsonl", method="lora", zero_stage=None, model_max_length=4096,
             per_device_train_batch_size=4, gradient_accumulation_steps=2, gradient_checkpointing=True)
    t.update(training)
    return Preset.model_validate({"cluster": {"nodes": [{"host": f"gpu{i}", "gpus": gpus} for i in range(nodes)],
                                              "shared_storage": True}, "training": t})


def facts(nodes=1, name=H100, mib=81559, torchao=("0.17.0",)):
    """Probed nodes; torchao: node i's torchao version (None: not installed), the last repeated."""
    versions = [torchao[min(i, len(torchao) - 1)] for i in range(nodes)]
    return ClusterFacts(nodes={i: NodeFacts(hostname=f"gpu{i}", gpus=[GPU(j, name, mib) for j in range(8)],
                                            versions={"torch": "2.11.0", "torchao": versions[i]})
                               for i in range(nodes)})


def codes(p, f=None, **kw):
    return [a.code for a in advise(p, f, **kw) if a.code.startswith("FP8")]


def test_the_preset_field_defaults_to_auto_and_refuses_anything_else():
    assert preset().training.fp8 == "auto"
    text = "cluster:\n  nodes: [{host: localhost, gpus: 1}]\ntraining:\n  model: builtin:tiny\n  data: d.jsonl\n  fp8: maybe\n"
    with pytest.raises(PresetError, match=r"training\.fp8"):
        parse_preset(text, "p.yaml")
    # YAML reads an unquoted on / off as a boolean: it still means on / off, and a saved preset says so again
    for word in ("on", "off", "'on'", "auto"):
        p = parse_preset(text.replace("maybe", word), "p.yaml")
        assert p.training.fp8 == word.strip("'")
        assert parse_preset(dump_preset(p), "again.yaml").training.fp8 == word.strip("'")


@pytest.mark.parametrize("fp8,argv", [("auto", []), ("on", ["--fp8", "on"]), ("off", ["--fp8", "off"])])
def test_the_plan_passes_fp8_and_the_worker_takes_it(fp8, argv):
    from training.args import parse_args

    a = worker_args(preset(fp8=fp8).training, metrics_file="m.jsonl")
    assert [x for i, x in enumerate(a) if x == "--fp8" or (i and a[i - 1] == "--fp8")] == argv
    flags = parse_args(a)  # the worker's own parser and checks take the plan's argv
    assert flags.fast.fp8 == fp8 and flags.fast.fp8_guard_steps == 8


def test_the_worker_and_the_estimate_share_the_rule_and_the_ratios_measured_through_the_worker():
    from training.fast import fp8

    assert fp8.AUTO_ON_FROM == est_time.FP8_AUTO_ON_FROM and fp8.MEASURED == est_time.FP8_MEASURED
    faster = []
    for row in est_time.FP8_RATIOS:  # each ratio counted is its results file's, for its method and hidden size
        measured = json.loads((ROOT / row.source.replace(".md", ".json")).read_text())
        (case,) = [c for c in measured["cases"] if c["case"] == row.case]
        assert case["compare"]["ratio"] == row.ratio and case["hidden_size"] == row.hidden, row
        assert (case["method"] == "full") == (row.method == "full") and case["compare"]["fp8_engaged"], row
        faster += [c for c in measured["cases"] if c.get("compare", {}).get("ratio", 0) >= measured["pays_at"]]
    assert {r.method for r in est_time.FP8_RATIOS} == {"lora", "full"}
    # auto turns FP8 on for a method only from a hidden size measured faster (by the results' own threshold)
    for method, smallest in est_time.FP8_AUTO_ON_FROM.items():
        assert smallest in {c["hidden_size"] for c in faster if (c["method"] == "full") == (method == "full")}
    assert not faster and est_time.FP8_AUTO_ON_FROM == {}  # nothing was: auto runs FP8 nowhere


@pytest.mark.parametrize("model,training,gpu,runs,x", [
    (SEVEN_B, {}, True, False, 1.0),  # auto: measured slower through the worker
    (SEVEN_B, {"method": "full", "zero_stage": 3}, True, False, 1.0),
    ("Qwen/Qwen2.5-72B-Instruct", {}, True, False, 1.0),
    (ONE_FIVE_B, {"method": "full"}, True, False, 1.0),
    (SEVEN_B, {"fp8": "on"}, True, True, 0.941),  # on runs it, at the worker's measured ratio
    (ONE_FIVE_B, {"fp8": "on"}, True, True, 0.941),  # LoRA's ratio, measured at the 7B shape
    (SEVEN_B, {"fp8": "on", "method": "full", "zero_stage": 3}, True, True, 0.916),  # full's at the 7B shape
    (ONE_FIVE_B, {"fp8": "on", "method": "full"}, True, True, 0.799),  # full's at the 1.5B shape
    ("Qwen/Qwen2.5-0.5B-Instruct", {"fp8": "on", "method": "full"}, True, True, 0.799),  # none below: the smallest
    ("Qwen/Qwen2.5-72B-Instruct", {"fp8": "on", "method": "full", "zero_stage": 3}, True, True, 0.916),
    (SEVEN_B, {"extra_args": ["--fp8", "on"]}, True, True, 0.941),  # extra_args win, as in the argv
    ("Qwen/Qwen3-30B-A3B", {"fp8": "on"}, True, True, 1.0),  # a mixture of experts: not measured
    (SEVEN_B, {"fp8": "on", "method": "qlora"}, True, False, 1.0),
    (SEVEN_B, {"fp8": "on", "precision": "fp16"}, True, False, 1.0),
    (SEVEN_B, {"fp8": "on", "extra_args": ["--fp8", "off"]}, True, False, 1.0),
    (SEVEN_B, {"fp8": "on"}, False, False, 1.0),  # an A100
    (SEVEN_B, {"fp8": "on"}, None, False, 1.0),  # the GPU type unknown
])
def test_the_estimate_counts_fp8_where_the_worker_runs_it_at_the_ratio_measured_through_it(model, training, gpu,
                                                                                          runs, x):
    spec = known_spec(model)
    run = est.RunShape.of(preset(model=model, **training).training)
    assert est_time.fp8_runs(spec, run, gpu)[0] is runs
    assert est_time.fp8_speedup(spec, run, gpu) == x


def test_auto_follows_a_measured_shape_once_the_table_holds_one(monkeypatch):
    monkeypatch.setattr(est_time, "FP8_AUTO_ON_FROM", {"lora": 3584})
    for model, method, runs in ((SEVEN_B, "lora", True), ("Qwen/Qwen2.5-72B-Instruct", "lora", True),
                                (ONE_FIVE_B, "lora", False), (SEVEN_B, "full", False)):
        run = est.RunShape.of(preset(model=model, method=method).training)
        assert est_time.fp8_runs(known_spec(model), run, True)[0] is runs, (model, method)


def test_the_step_time_divides_compute_by_the_ratio_measured_through_the_worker():
    spec, kw = known_spec(SEVEN_B), dict(gpu_tflops=989, hbm_gbs=3350)
    auto = est_time.estimate_step(spec, preset().training, 1, 1, None, fp8_gpu=True, **kw)
    bf16 = est_time.estimate_step(spec, preset().training, 1, 1, None, fp8_gpu=False, **kw)
    assert not auto.fp8 and auto.compute_s == bf16.compute_s  # auto: bf16 on an H100
    fp8 = est_time.estimate_step(spec, preset(fp8="on").training, 1, 1, None, fp8_gpu=True, **kw)
    assert fp8.fp8 and fp8.fp8_speedup == 0.941
    assert fp8.compute_s == pytest.approx(bf16.compute_s / 0.941)
    assert fp8.optimizer_s == bf16.optimizer_s and fp8.tokens_per_second < 0.95 * bf16.tokens_per_second


def test_fp8_on_where_the_worker_would_refuse_it_is_an_error_with_its_fix():
    cases = [({"method": "qlora"}, facts(), "Q-LoRA's 4-bit base", {"training.fp8": "auto"}),
             ({"precision": "fp16"}, facts(), "precision is fp16", {"training.precision": "bf16"}),
             ({}, facts(name="NVIDIA A100-SXM4-80GB"), "A100-80G has no FP8 tensor cores", {"training.fp8": "auto"}),
             ({"device": "cpu"}, None, "CPU processes", {"training.fp8": "auto"}),
             ({}, facts(nodes=2, torchao=("0.17.0", None)), "torchao is not installed on node(s) 1", {})]
    for training, f, words, changes in cases:
        p = preset(nodes=2 if f and len(f.nodes) == 2 else 1, fp8="on", **training)
        adv = [a for a in advise(p, f) if a.code == "FP8_CANNOT_RUN"]
        assert len(adv) == 1 and adv[0].level == "error" and words in adv[0].message, (training, adv)
        assert adv[0].fix.changes == changes
        if changes:
            assert "FP8_CANNOT_RUN" not in codes(apply_fix(p, adv[0].fix), f)
        else:
            assert "pip install torchao" in adv[0].fix.hint
    assert "FP8_CANNOT_RUN" not in codes(preset(fp8="on"), facts())


def test_auto_runs_no_fp8_and_on_warns_it_measured_slower_through_the_worker():
    # auto: nothing on an H100, an H200, an A100, for a 7B or a 1.5B, LoRA or full, with the GPU type unknown, or off
    assert codes(preset(), facts()) == [] and codes(preset(method="full", zero_stage=3), facts()) == []
    assert codes(preset(model=ONE_FIVE_B), facts()) == [] and codes(preset(), gpu="H200") == []
    assert codes(preset(), facts(name="NVIDIA A100-SXM4-80GB")) == [] and codes(preset()) == []
    assert codes(preset(fp8="off"), facts()) == []
    for training, words in (({}, "0.94x bf16's tokens/s through the worker for LoRA at the 7B shape"),
                            ({"model": ONE_FIVE_B}, "0.94x bf16's tokens/s through the worker for LoRA at the 7B"),
                            ({"method": "full", "zero_stage": 3}, "0.92x bf16's tokens/s through the worker for "
                                                                  "full fine-tuning at the 7B (ZeRO-3) shape "
                                                                  "(bench/results/fp8_worker-2026-12-05-H100-zero3.md)"),
                            ({"model": ONE_FIVE_B, "method": "full"}, "0.80x bf16's tokens/s through the worker "
                                                                      "for full fine-tuning at the 1.5B shape "
                                                                      f"({est_time.FP8_MEASURED})")):
        adv = [a for a in advise(preset(fp8="on", **training), facts()) if a.code.startswith("FP8")]
        assert [(a.code, a.level) for a in adv] == [("FP8_ON", "warning")], training
        assert "measured slower" in adv[0].message and words in adv[0].message
        assert "counted in the step time" in adv[0].message
        assert "faster" not in adv[0].message  # no speed-up claimed
        assert adv[0].fix.changes == {"training.fp8": "auto"}
        assert codes(apply_fix(preset(fp8="on", **training), adv[0].fix), facts()) == []
    assert codes(preset(fp8="on"), gpu="H200") == ["FP8_ON"]  # the GPU type the wizard or --gpu gives


def test_fp8_on_for_a_mixture_of_experts_is_unmeasured():
    adv = [a for a in advise(preset(model="Qwen/Qwen3-30B-A3B", fp8="on"), facts()) if a.code.startswith("FP8")]
    assert [(a.code, a.level) for a in adv] == [("FP8_UNMEASURED", "warning")]
    assert "mixture of experts, where FP8 was not measured" in adv[0].message and est_time.FP8_MEASURED in adv[0].message
    assert adv[0].fix.changes == {"training.fp8": "auto"}


def test_a_node_without_torchao_keeps_auto_in_bf16_everywhere_and_the_estimate_too(monkeypatch):
    p = preset(nodes=2)
    assert codes(p, facts(nodes=2, torchao=(None,))) == []  # auto runs FP8 nowhere: nothing to say
    monkeypatch.setattr(est_time, "FP8_AUTO_ON_FROM", {"lora": 3584})  # once a shape is measured faster, it speaks
    for versions, level in (((None,), "info"), (("0.17.0", None), "warning")):
        f = facts(nodes=2, torchao=versions)
        adv = [a for a in advise(p, f) if a.code.startswith("FP8")]
        assert [(a.code, a.level) for a in adv] == [("FP8_TORCHAO", level)], versions
        assert "stays off, on every node" in adv[0].message and "pip install torchao" in adv[0].fix.hint
    from qwen_tui.advice.core import make_context

    assert make_context(p, facts(nodes=2, torchao=(None,))).fp8_gpu is False
    assert make_context(p, facts(nodes=2)).fp8_gpu is True
    # a probe from before torchao was asked about says nothing of it: the GPU type decides
    old = facts(nodes=2)
    for nf in old.nodes.values():
        del nf.versions["torchao"]
    assert make_context(p, old).fp8_gpu is True and codes(p.with_changes({"training.fp8": "on"}), old) == ["FP8_ON"]
