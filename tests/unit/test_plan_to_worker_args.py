"""The plan and the worker agree on the command line: every shipped preset's worker argv,
as make_plan builds it, parses with training.args (the worker's own parser and checks),
and its DeepSpeed config loads and fills with training.dsconfig. Each side also has tests
of its own; this one fails when a flag is renamed on one side only."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen_tui.model.spec import resolve_model
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.files import load_preset
from qwen_tui.preset.schema import Preset
from support.paths import ROOT
from training import dsconfig
from training.args import parse_args

PRESETS = sorted((ROOT / "presets").glob("*.yaml"))


def worker_argvs(preset: Preset, tmp_path: Path) -> list[list[str]]:
    plan = make_plan(preset, run_id="r1", local_run_dir=str(tmp_path / "r1"), base_dir=str(ROOT),
                     local_python="/usr/bin/python3")
    out = []
    for node in plan.nodes:
        i = node.argv.index("training.finetune")
        assert node.argv[i - 1] == "-m"
        out.append(node.argv[i + 1:])
    return out


def check_worker_side(preset: Preset, tmp_path: Path) -> None:
    for argv in worker_argvs(preset, tmp_path):
        args = parse_args(argv)  # argparse exits (SystemExit) on an unknown flag; check_args raises InputError
        t = preset.training
        assert (args.model.model_name_or_path, args.data.data_path, args.train.max_steps) == (t.model, t.data,
                                                                                               t.max_steps)
        assert args.pref.pref_ftx == t.pref_ftx
        assert bool(args.lora.use_lora) == (t.method in ("lora", "qlora"))
        assert bool(args.lora.q_lora) == (t.method == "qlora")
        assert args.train.bf16 == (t.precision == "bf16") and args.train.fp16 == (t.precision == "fp16")
        assert (args.pref.stage, args.pref.pref_beta, args.pref.pref_loss) == (t.stage, t.pref_beta, t.pref_loss)
        if t.zero_stage is None:
            assert args.train.deepspeed is None
            continue
        spec = resolve_model(preset.training.model, base_dir=str(ROOT))  # the DPO demo's model exists after SFT
        raw = dsconfig.load(args.train.deepspeed)
        assert dsconfig.zero_stage(raw) == t.zero_stage
        model_config = {"hidden_size": spec.hidden, "num_attention_heads": spec.heads,
                        "num_key_value_heads": spec.kv_heads, "intermediate_size": spec.intermediate}
        world = sum(n.gpus for n in preset.cluster.nodes)
        cfg = dsconfig.fill(args.train.deepspeed, raw, args.train, world, spec.hidden, on_cpu=t.device == "cpu",
                            layer_params=dsconfig.layer_numel(model_config))
        assert cfg["train_batch_size"] == t.per_device_train_batch_size * t.gradient_accumulation_steps * world
        offloaded = cfg["zero_optimization"].get("offload_optimizer", {}).get("device")
        assert (offloaded == "cpu") == (t.offload != "none")


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_shipped_preset_worker_args_parse_and_fill(path, tmp_path):
    check_worker_side(load_preset(path), tmp_path)


# Every choice that changes the worker's flags, on the demo preset: ZeRO stage and offload,
# method, precision, eval and checkpointing.
VARIANTS = [
    {"zero_stage": None}, {"zero_stage": 2}, {"zero_stage": 3},
    {"zero_stage": 2, "offload": "optimizer"}, {"zero_stage": 3, "offload": "optimizer"},
    {"zero_stage": 3, "offload": "all"},
    {"method": "full", "zero_stage": 3}, {"method": "qlora", "zero_stage": 2, "precision": "bf16", "device": "auto"},
    {"precision": "bf16"}, {"precision": "fp16", "device": "auto"},
    {"eval_data": "builtin:demo-chat", "eval_steps": 5}, {"gradient_checkpointing": True, "save_total_limit": 2},
    {"stage": "dpo", "data": "builtin:demo-pref", "pref_beta": 0.2, "pref_loss": "ipo", "pref_ftx": 0.5},
]


def test_a_mixture_reaches_the_worker_as_its_datasets(tmp_path):
    import json

    demo = load_preset(ROOT / "presets" / "local-demo.yaml")
    data = demo.model_dump(mode="python", exclude_unset=True)
    del data["training"]["data"]
    data["training"]["datasets"] = [{"path": "a.jsonl", "weight": 2}, {"path": "b.parquet", "records": 50,
                                                                       "format": "alpaca"},
                                    {"dataset_info": "data/dataset_info.json", "name": "glaive"}]
    (argv, *_) = worker_argvs(Preset.model_validate(data), tmp_path)
    args = parse_args(argv)
    assert args.data.data_path is None
    assert json.loads(args.data.datasets) == data["training"]["datasets"]


@pytest.mark.parametrize("change", VARIANTS, ids=[",".join(f"{k}={v}" for k, v in c.items()) for c in VARIANTS])
def test_demo_variants_worker_args_parse_and_fill(change, tmp_path):
    demo = load_preset(ROOT / "presets" / "local-demo.yaml")
    data = demo.model_dump(mode="python", exclude_unset=True)
    data["training"].update(change)
    check_worker_side(Preset.model_validate(data), tmp_path)


def test_a_missing_mixture_source_is_said_before_launch_naming_its_entry(tmp_path):
    from qwen_tui.run.api import local_files_missing

    demo = load_preset(ROOT / "presets" / "local-demo.yaml")
    data = demo.model_dump(mode="python", exclude_unset=True)
    del data["training"]["data"]
    there = tmp_path / "a.jsonl"
    there.write_text("{}\n")
    data["training"]["datasets"] = [{"path": str(there)}, {"path": str(tmp_path / "gone.parquet"), "weight": 1.0},
                                    {"path": "hf:acme/chat"}]
    got = local_files_missing(Preset.model_validate(data))
    assert [(a.code, a.message.split(":")[0]) for a in got] == [("DATA_MISSING", "training.datasets.1.path")]
