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
    assert fp8.AUTO_MIN_ROW == est_time.FP8_AUTO_MIN_ROW and fp8.RESULTS == est_time.FP8_RESULTS
    cases = []
    for row in est_time.FP8_RATIOS:  # each ratio counted is its results file's, for its method, size and rows
        measured = json.loads((ROOT / row.source.replace(".md", ".json")).read_text())
        (case,) = [c for c in measured["cases"] if c["case"] == row.case]
        assert case["compare"]["ratio"] == row.ratio and case["hidden_size"] == row.hidden, row
        assert (case["method"] == "full") == (row.method == "full") and case["compare"]["fp8_engaged"], row
        assert bool(case["zero"]) == row.deepspeed, row
        rows = case["arms"]["fp8"].get("packing_tokens") or case["row"]
        assert fp8.row_tokens(rows, case["records"] * case["seq"]) == row.rows, row
        cases.append((row, case["compare"]["ratio"] >= measured["pays_at"] and case["compare"]["parity"]))
    assert {r.method for r in est_time.FP8_RATIOS} == {"lora", "full"}
    # auto turns FP8 on for a method from a hidden size measured faster without DeepSpeed in rows of AUTO_MIN_ROW
    # tokens or more, and no measured case outside that rule paid
    faster = [r for r, pays in cases if pays]
    assert faster and all(not r.deepspeed and r.rows >= fp8.AUTO_MIN_ROW for r in faster)
    for method, smallest in est_time.FP8_AUTO_ON_FROM.items():
        assert smallest == min(r.hidden for r in faster if r.method == method)
    assert {r.method for r in faster} == set(est_time.FP8_AUTO_ON_FROM)
    assert not [r for r, pays in cases if not pays and r.method in est_time.FP8_AUTO_ON_FROM and not r.deepspeed
                and r.rows >= fp8.AUTO_MIN_ROW and r.hidden >= est_time.FP8_AUTO_ON_FROM[r.method]]


H100_GIB, H200_GIB = est.GPUS["H100"].memory_gib, est.GPUS["H200"].memory_gib
NO_CKPT = {"gradient_checkpointing": False}


@pytest.mark.parametrize("model,training,gpu,gib,runs,x", [
    (SEVEN_B, NO_CKPT, True, H200_GIB, True, 1.102),  # auto: a 7B LoRA base, rows of 8,192+ by the memory model
    (SEVEN_B, NO_CKPT, True, H100_GIB, False, 1.0),  # the model's rows on an H100: about 4,700 (the probe's: 8,320)
    (SEVEN_B, {}, True, H200_GIB, True, 1.171),  # with gradient checkpointing: 1.17x measured with it
    (SEVEN_B, {**NO_CKPT, "zero_stage": 2}, True, H200_GIB, False, 1.0),  # DeepSpeed: within noise
    (SEVEN_B, {**NO_CKPT, "model_max_length": 1024, "gradient_accumulation_steps": 1}, True, H200_GIB, False, 1.0),
    ("Qwen/Qwen2.5-72B-Instruct", NO_CKPT, True, H200_GIB, False, 1.0),  # nothing fits without checkpointing
    (ONE_FIVE_B, NO_CKPT, True, H200_GIB, False, 1.0),  # under the 7B hidden size
    (SEVEN_B, {"method": "full", "zero_stage": 3}, True, H100_GIB, False, 1.0),
    (ONE_FIVE_B, {"method": "full"}, True, H100_GIB, False, 1.0),
    (SEVEN_B, {**NO_CKPT, "fp8": "on"}, True, H100_GIB, True, 0.941),  # on: measured nearest, rows of 4,096
    (SEVEN_B, {"fp8": "on"}, True, H100_GIB, True, 1.171),  # checkpointing: the ratio measured with it
    (SEVEN_B, {"fp8": "on", "per_device_train_batch_size": 1}, True, H100_GIB, True, 1.0),  # 8,192: under its rows
    (SEVEN_B, {**NO_CKPT, "fp8": "on"}, True, H200_GIB, True, 1.102),
    (ONE_FIVE_B, {**NO_CKPT, "fp8": "on"}, True, H100_GIB, True, 1.0),  # 7B's gain is not counted for a 1.5B
    (SEVEN_B, {"fp8": "on", "method": "full", "zero_stage": 3}, True, H100_GIB, True, 1.0),  # 1.047: within noise
    (ONE_FIVE_B, {"fp8": "on", "method": "full"}, True, H100_GIB, True, 0.98),  # in the probe's long rows
    (ONE_FIVE_B, {"fp8": "on", "method": "full", "model_max_length": 1024}, True, H100_GIB, True, 0.799),
    ("Qwen/Qwen2.5-0.5B-Instruct", {"fp8": "on", "method": "full"}, True, H100_GIB, True, 0.98),  # the smallest
    (SEVEN_B, {**NO_CKPT, "extra_args": ["--fp8", "on"]}, True, H100_GIB, True, 0.941),  # extra_args win
    ("Qwen/Qwen3-30B-A3B", {"fp8": "on"}, True, H100_GIB, True, 1.0),  # a mixture of experts: not measured
    (SEVEN_B, {"fp8": "on", "method": "qlora"}, True, H100_GIB, False, 1.0),
    (SEVEN_B, {"fp8": "on", "precision": "fp16"}, True, H100_GIB, False, 1.0),
    (SEVEN_B, {"fp8": "on", "extra_args": ["--fp8", "off"]}, True, H100_GIB, False, 1.0),
    (SEVEN_B, {"fp8": "on"}, False, H100_GIB, False, 1.0),  # an A100
    (SEVEN_B, {"fp8": "on"}, None, None, False, 1.0),  # the GPU type unknown
])
def test_the_estimate_counts_fp8_where_the_worker_runs_it_at_the_ratio_measured_through_it(model, training, gpu, gib,
                                                                                          runs, x):
    spec = known_spec(model)
    run = est.RunShape.of(preset(model=model, **training).training)
    on, why = est_time.fp8_runs(spec, run, gpu, gib, 8)
    assert on is runs, why
    assert est_time.fp8_decision(spec, run, gpu, gib, 8).speedup == x


def test_auto_says_why_it_keeps_bf16_naming_the_rows():
    spec = known_spec(SEVEN_B)

    def why(gib, **training):
        return est_time.fp8_runs(spec, est.RunShape.of(preset(**training).training), True, gib, 1)[1]

    assert "about 4,681 tokens, under 8,192; the worker's memory probe may size them longer" in why(H100_GIB, **NO_CKPT)
    assert "at most 2,048 tokens (a step's records)" in why(H200_GIB, gradient_checkpointing=False,
                                                             model_max_length=1024, per_device_train_batch_size=2,
                                                             gradient_accumulation_steps=1)
    two = est.RunShape.of(preset(gradient_checkpointing=False, sequence_parallel_size=4).training)
    assert est_time.fp8_row_tokens(spec, two, None) == (8192, None)  # a step of 32,768 over 4 GPUs
    assert "under DeepSpeed" in why(H200_GIB, zero_stage=2, gradient_checkpointing=False)
    assert "full fine-tuning measured no faster" in why(H200_GIB, method="full")


def test_the_step_time_divides_compute_by_the_ratio_measured_through_the_worker():
    spec, kw = known_spec(SEVEN_B), dict(gpu_tflops=989, hbm_gbs=3350)
    auto = est_time.estimate_step(spec, preset().training, 1, 1, None, fp8_gpu=True, **kw)
    bf16 = est_time.estimate_step(spec, preset().training, 1, 1, None, fp8_gpu=False, **kw)
    # auto with checkpointing (rows of 32,768): 7B LoRA's 1.17x, measured with checkpointing
    assert auto.fp8 and auto.fp8_speedup == 1.171 and auto.compute_s == pytest.approx(bf16.compute_s / 1.171)
    fp8 = est_time.estimate_step(spec, preset(fp8="on", **NO_CKPT).training, 1, 1, None, fp8_gpu=True, **kw)
    bf16 = est_time.estimate_step(spec, preset(**NO_CKPT).training, 1, 1, None, fp8_gpu=False, **kw)
    assert fp8.fp8 and fp8.fp8_speedup == 0.941
    assert fp8.compute_s == pytest.approx(bf16.compute_s / 0.941)
    assert fp8.optimizer_s == bf16.optimizer_s and fp8.tokens_per_second < 0.95 * bf16.tokens_per_second
    t = preset(gradient_checkpointing=False).training
    fast = est_time.estimate_step(spec, t, 1, 1, None, fp8_gpu=True, gpu_gib=H200_GIB, **kw)
    plain = est_time.estimate_step(spec, t, 1, 1, None, fp8_gpu=False, gpu_gib=H200_GIB, **kw)
    assert fast.fp8 and fast.fp8_speedup == 1.102 and fast.compute_s == pytest.approx(plain.compute_s / 1.102)


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


def test_auto_runs_fp8_only_where_measured_faster_and_on_says_what_it_measured():
    # auto: nothing for full, a 1.5B, an A100, an unknown GPU type, or off
    assert codes(preset(method="full", zero_stage=3), facts()) == []
    assert codes(preset(model=ONE_FIVE_B), facts()) == []
    assert codes(preset(), facts(name="NVIDIA A100-SXM4-80GB")) == [] and codes(preset()) == []
    # the preset's 7B LoRA with checkpointing on an H100 or H200: FP8 runs at the ratio measured with checkpointing
    for adv in ([a for a in advise(preset(), facts()) if a.code.startswith("FP8")],
                [a for a in advise(preset(), gpu="H200") if a.code.startswith("FP8")]):
        assert [(a.code, a.level) for a in adv] == [("FP8_ON", "info")]
        assert ("faster: 1.17x bf16's tokens/s through the worker for LoRA, 7B with gradient checkpointing in rows "
                f"of 16,384 (1.21x on an H200) ({est_time.FP8_MEASURED_CKPT})") in adv[0].message
    assert codes(preset(fp8="off"), facts()) == []
    # auto on an H200, 7B LoRA without checkpointing: FP8 runs, faster, counted
    adv = [a for a in advise(preset(**NO_CKPT), gpu="H200") if a.code.startswith("FP8")]
    assert [(a.code, a.level) for a in adv] == [("FP8_ON", "info")]
    assert ("faster: 1.10x bf16's tokens/s through the worker for LoRA, 7B in rows of 8,192 "
            f"({est_time.FP8_MEASURED}), counted in the step time") in adv[0].message
    assert adv[0].fix.changes == {"training.fp8": "off"}
    for training, level, words in (
            (NO_CKPT, "warning", "slower: 0.94x bf16's tokens/s through the worker for LoRA, 7B in rows of 4,096"),
            ({"model": ONE_FIVE_B}, "info", "no faster: 1.17x bf16's tokens/s through the worker for LoRA, 7B with "
                                            "gradient checkpointing"),  # 7B's gain is not counted for a 1.5B
            ({"method": "full", "zero_stage": 3}, "info", "no faster: 1.05x bf16's tokens/s through the worker for "
                                                          "full fine-tuning, 7B (ZeRO-3) in rows of 8,192"),
            ({"model": ONE_FIVE_B, "method": "full"}, "warning", "slower: 0.98x bf16's tokens/s through the worker "
                                                                 "for full fine-tuning, 1.5B in rows of 32,768")):
        adv = [a for a in advise(preset(fp8="on", **training), facts()) if a.code.startswith("FP8")]
        assert [(a.code, a.level) for a in adv] == [("FP8_ON", level)], (training, adv)
        assert words in adv[0].message, adv[0].message
        assert "It measured faster" not in adv[0].message  # no speed-up claimed
        assert adv[0].fix.changes == {"training.fp8": "auto"}
        assert codes(apply_fix(preset(fp8="on", **training), adv[0].fix), facts()) == []
    assert codes(preset(fp8="on"), gpu="H200") == ["FP8_ON"]  # the GPU type the wizard or --gpu gives


def test_fp8_on_for_a_mixture_of_experts_is_unmeasured():
    adv = [a for a in advise(preset(model="Qwen/Qwen3-30B-A3B", fp8="on"), facts()) if a.code.startswith("FP8")]
    assert [(a.code, a.level) for a in adv] == [("FP8_UNMEASURED", "warning")]
    assert "mixture of experts, where FP8 was not measured" in adv[0].message and est_time.FP8_MEASURED in adv[0].message
    assert adv[0].fix.changes == {"training.fp8": "auto"}


def test_a_node_without_torchao_keeps_auto_in_bf16_everywhere_and_the_estimate_too():
    # auto keeps bf16 here anyway (full fine-tuning): silent
    assert codes(preset(nodes=2, method="full"), facts(nodes=2, torchao=(None,))) == []
    p = preset(nodes=2, **NO_CKPT)
    h200 = dict(name="NVIDIA H200", mib=143771)
    for versions, level in (((None,), "info"), (("0.17.0", None), "warning")):
        f = facts(nodes=2, torchao=versions, **h200)
        adv = [a for a in advise(p, f) if a.code.startswith("FP8")]
        assert [(a.code, a.level) for a in adv] == [("FP8_TORCHAO", level)], versions
        assert "stays off, on every node" in adv[0].message and "pip install torchao" in adv[0].fix.hint
    from qwen_tui.advice.core import make_context

    assert make_context(p, facts(nodes=2, torchao=(None,))).fp8_gpu is False
    assert make_context(p, facts(nodes=2)).fp8_gpu is True
    # a probe from before torchao was asked about says nothing of it: the GPU type decides
    old = facts(nodes=2, **h200)
    for nf in old.nodes.values():
        del nf.versions["torchao"]
    assert make_context(p, old).fp8_gpu is True and codes(p.with_changes({"training.fp8": "on"}), old) == ["FP8_ON"]


@pytest.mark.parametrize("training, compiled", [
    ({}, True), ({"device": "cuda"}, True), ({"device": "cpu"}, False), ({"extra_args": ["--no_compile"]}, False),
])
def test_the_estimate_counts_compiled_layers_where_the_worker_compiles_them(training, compiled):
    # the worker compiles on CUDA only: a CPU run's layers keep what transformers' eager layers keep
    run = est.RunShape.of(preset(method="full", gradient_checkpointing=False, **training).training)
    assert run.compiled is compiled
    spec = known_spec(ONE_FIVE_B)
    eager = est.RunShape.of(run, compiled=False)
    same = est.estimate_memory(spec, run, 1).activations == est.estimate_memory(spec, eager, 1).activations
    assert same is not compiled
