"""The data preview's arithmetic and advice over worker counts (pure: no torch, no subprocess)."""


from qwen_tui.advice.datapreview import build_report, histogram_lines, preview_command, summary_lines, tokens_per_second
from qwen_tui.preset.files import load_preset
from support.paths import ROOT


def counts(**kw):
    c = {"data": "d.jsonl", "model": "m", "model_max_length": 2048, "records": 1000, "usable": 1000, "dropped": 0,
         "truncated": 0, "truncated_ids": [], "tokens": 1_000_000, "supervised_tokens": 400_000,
         "length_percentiles": {"p50": 900, "p90": 1800, "p99": 2000, "max": 2100},
         "histogram": {"edges": [100, 600, 1100, 1600, 2100, 2600], "counts": [100, 400, 300, 190, 10]},
         "world_size": 16, "global_batch_size": 64, "steps_per_epoch": 15, "total_steps": 30,
         "records_per_epoch": 960, "tokens_per_epoch": 960_000, "packing": True, "packing_tokens": 4096,
         "steps_measured": 15, "padding_waste": 0.0}
    c.update(kw)
    return c


def test_timing_from_tokens_per_second_and_padding():
    preset = load_preset(ROOT / "presets" / "qwen2.5-7b-lora-2node-ddp.yaml")
    r = build_report(counts(), preset, 10_000.0)
    assert r["epoch_seconds"] == 96.0 and r["run_seconds"] == 192.0
    assert r["supervised_share"] == 0.4
    assert r["advice"] == []
    padded = build_report(counts(padding_waste=0.5, packing=False), preset, 10_000.0)
    assert padded["epoch_seconds"] == 192.0  # half of what each step computes is padding
    codes = {a["code"]: a for a in padded["advice"]}
    assert "DATA_PADDING" in codes
    assert build_report(counts(), preset, None)["epoch_seconds"] is None


def test_truncation_warning_fix_is_p99():
    preset = load_preset(ROOT / "presets" / "qwen2.5-7b-lora-2node-ddp.yaml")
    preset.training.model_max_length = 1024
    r = build_report(counts(truncated=11, model_max_length=1024), preset, None)  # 1.1% of the records
    (warn,) = [a for a in r["advice"] if a["code"] == "DATA_TRUNCATED"]
    assert warn["fix"]["changes"] == {"training.model_max_length": 2000}
    r = build_report(counts(truncated=10, model_max_length=1024), preset, None)  # exactly 1%: no warning
    assert not [a for a in r["advice"] if a["code"] == "DATA_TRUNCATED"]
    r = build_report(counts(steps_per_epoch=0, usable=50), preset, None)
    assert [a["code"] for a in r["advice"]] == ["DATA_TOO_SMALL"]


def test_histogram_bars_and_summary():
    lines = histogram_lines(counts()["histogram"], width=20, max_length=1024)
    assert len(lines) == 5
    assert lines[1].count("█") == 20 and lines[0].count("█") == 5
    assert lines[2].endswith("(cut)") and "cut" not in lines[0]
    assert lines[1].endswith("(partly cut)")  # 600-1099 runs across the cut at 1024: not every record there is cut
    text = "\n".join(summary_lines(build_report(counts(), load_preset(ROOT / "presets" / "local-demo.yaml"), 5000.0)))
    assert "p99 2,000" in text and "40.0%" in text and "3 min 12 s an epoch" in text


def test_speed_from_the_estimate_and_the_command():
    gpu = load_preset(ROOT / "presets" / "qwen2.5-7b-lora-2node-ddp.yaml")
    tps, where = tokens_per_second(gpu, gpu="H100", bandwidth_gbps=400)
    assert tps and tps > 1000 and "H100" in where and "given bandwidth" in where
    # two nodes and no link measured, or no GPU type: no figure, and how to learn it
    none, why = tokens_per_second(gpu, gpu="H100")
    assert none is None and "qwen-tui check" in why
    assert tokens_per_second(gpu, bandwidth_gbps=400)[0] is None
    cpu = load_preset(ROOT / "presets" / "local-demo.yaml")
    assert tokens_per_second(cpu)[0] is None
    argv, cwd = preview_command(cpu, base_dir="/base", local_python="/venv/bin/python")
    assert argv[:3] == ["/venv/bin/python", "-m", "training.datapreview"]
    assert argv[argv.index("--world_size") + 1] == "2" and argv[argv.index("--device") + 1] == "cpu"
    worker = argv[argv.index("--") + 1:]
    assert worker[worker.index("--model_max_length") + 1] == "256" and "--use_cpu" in worker
    assert cwd == "/base"


def test_no_length_is_advised_past_the_models_positions_or_what_a_gpu_trains():
    """One long outlier puts the p99 at 28,926 tokens on a model of 2,048 positions: the fix stops at 2,048, and none
    is offered when the length is there already."""
    preset = load_preset(ROOT / "presets" / "qwen2.5-7b-lora-2node-ddp.yaml")
    preset.training.model_max_length = 1024
    c = counts(records=21, usable=21, truncated=2, dropped=1, model_max_length=1024, max_positions=2048,
               length_percentiles={"p50": 700, "p90": 1500, "p99": 28926, "max": 28926})
    adv = {a["code"]: a for a in build_report(c, preset, None)["advice"]}
    assert adv["DATA_TRUNCATED"]["fix"]["changes"] == {"training.model_max_length": 2048}
    assert "the model has 2,048 positions" in adv["DATA_TRUNCATED"]["message"]
    assert adv["DATA_DROPPED"]["fix"]["changes"] == {"training.model_max_length": 2048}
    assert "the model's positions" in adv["DATA_DROPPED"]["fix"]["label"]
    limited = build_report(c, preset, None, limit=1536, limit_where="H100")
    assert {a["code"]: a for a in limited["advice"]}["DATA_TRUNCATED"]["fix"]["changes"] == \
        {"training.model_max_length": 1536}
    preset.training.model_max_length = 2048
    at_cap = {a["code"]: a for a in build_report({**c, "model_max_length": 2048}, preset, None)["advice"]}
    assert at_cap["DATA_TRUNCATED"]["fix"] is None and at_cap["DATA_DROPPED"]["fix"] is None
