"""qwen-tui estimate: stable JSON keys, human tables, facts and overrides, unknown models."""

import json

import pytest

from qwen_tui.cli.facts_file import read_facts_file
from qwen_tui.cli.main import main
from qwen_tui.cluster.facts import GPU, ClusterFacts, LinkFacts, NodeFacts
from support.paths import ROOT as REPO

PRESET_14B = REPO / "presets" / "qwen2.5-14b-full-4node-zero3.yaml"
STABLE_KEYS = {"gpu_memory_gb", "step_time_s", "tokens_per_second", "scaling_efficiency", "advice",
               "recommended", "model", "gpu", "step", "tokens_per_step", "error"}


def run_json(capsys, *argv):
    assert main(["estimate", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_keys_and_values(capsys):
    out = run_json(capsys, PRESET_14B, "--gpu", "H100", "--bus-gbps", "25")
    assert STABLE_KEYS <= set(out)
    mem = out["gpu_memory_gb"]
    parts = sum(mem[k] for k in ("weights", "gradients", "optimizer", "activations", "logits", "overhead"))
    assert mem["total"] == pytest.approx(parts, abs=0.01)
    assert mem["fits"] is True
    assert out["step_time_s"] > 0 and out["tokens_per_second"] > 0
    assert [p["nodes"] for p in out["scaling_efficiency"]] == [1, 2, 3, 4]
    assert out["scaling_efficiency"][0]["scaling_efficiency"] == pytest.approx(1.0)
    codes = {a["code"] for a in out["advice"]}
    assert "ZERO3_SLOW_LINK" in codes
    for a in out["advice"]:
        assert set(a) >= {"code", "level", "message", "fix"}


def test_bandwidth_changes_the_prediction(capsys):
    slow = run_json(capsys, PRESET_14B, "--gpu", "H100", "--bus-gbps", "10")
    fast = run_json(capsys, PRESET_14B, "--gpu", "H100", "--bus-gbps", "1600")
    assert slow["step_time_s"] > fast["step_time_s"]
    assert "ZERO3_SLOW_LINK" not in {a["code"] for a in fast["advice"]}


def test_facts_file_supplies_gpu_and_bandwidth(tmp_path, capsys):
    f = ClusterFacts(nodes={i: NodeFacts(gpus=[GPU(j, "NVIDIA A100-SXM4-40GB", 40960) for j in range(8)])
                            for i in range(4)},
                     links={i: LinkFacts(bandwidth_gbps=5.0) for i in (1, 2, 3)})
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(f.to_dict()))
    out = run_json(capsys, PRESET_14B, "--facts", path)
    assert out["gpu"]["name"] == "A100-40G" and out["gpu"]["memory_gib"] == pytest.approx(40.0)
    assert out["bandwidth_gbps"] == 5.0
    assert "LOW_BANDWIDTH" in {a["code"] for a in out["advice"]}


def test_memory_override_triggers_oom(capsys):
    out = run_json(capsys, PRESET_14B, "--gpu-memory-gib", "8")
    assert out["gpu_memory_gb"]["fits"] is False
    assert "OOM" in {a["code"] for a in out["advice"]}


def test_unknown_model_reports_instead_of_crashing(tmp_path, capsys):
    text = PRESET_14B.read_text().replace("Qwen/Qwen2.5-14B-Instruct", "someone/UnknownLM-3B")
    p = tmp_path / "p.yaml"
    p.write_text(text)
    out = run_json(capsys, p, "--gpu", "H100")
    assert out["gpu_memory_gb"] is None and out["step_time_s"] is None and "unknown model" in out["error"]
    assert "MODEL_UNKNOWN" in {a["code"] for a in out["advice"]}
    assert main(["estimate", str(p)]) == 0
    assert "unknown model" in capsys.readouterr().out


def test_human_output_has_tables_and_advice(capsys):
    assert main(["estimate", str(PRESET_14B), "--gpu", "H100", "--bus-gbps", "25"]) == 0
    out = capsys.readouterr().out
    for word in ("weights", "activations", "tokens/s", "efficiency", "ZERO3_SLOW_LINK", "Use ZeRO-2"):
        assert word in out


def test_bad_facts_file(tmp_path, capsys):
    bad = tmp_path / "f.json"
    bad.write_text("{not json")
    assert main(["estimate", str(PRESET_14B), "--facts", str(bad)]) == 2
    assert "cannot read facts" in capsys.readouterr().err


def test_estimate_never_writes_the_preset(tmp_path, capsys):
    p = tmp_path / "p.yaml"
    p.write_text(PRESET_14B.read_text())
    before = p.stat().st_mtime_ns, p.read_bytes()
    run_json(capsys, p, "--gpu-memory-gib", "8")
    assert (p.stat().st_mtime_ns, p.read_bytes()) == before


def test_a_cpu_run_gets_memory_but_no_gpu_speed_figures(capsys):
    demo = REPO / "presets" / "local-demo.yaml"  # training.device: cpu
    out = run_json(capsys, demo)
    assert out["cpu"] is True and out["gpu_memory_gb"]["total"] > 0
    assert out["step"] is None and out["step_time_s"] is None and out["tokens_per_second"] is None
    assert out["scaling_efficiency"] == [] and out["efficiency"] is None
    assert main(["estimate", str(demo)]) == 0
    text = capsys.readouterr().out
    assert "2 CPU process(es)" in text and "Memory per process" in text and "tokens/s" not in text
    gpu = run_json(capsys, PRESET_14B, "--gpu", "H100", "--bus-gbps", "400")
    assert gpu["cpu"] is False and gpu["step_time_s"] > 0


def test_the_shipped_7b_lora_presets_get_the_advice_the_readme_says(capsys):
    ddp = run_json(capsys, REPO / "presets" / "qwen2.5-7b-lora-2node-ddp.yaml", "--gpu", "H100",
                   "--bus-gbps", "400")
    # no advice: the memory model puts an H100's rows for it under the 8,192 tokens FP8's auto asks (the worker's
    # probe may size them longer and then runs FP8), so the estimate counts bf16
    assert ddp["advice"] == [] and ddp["gpu_memory_gb"]["fits"] is True
    assert ddp["step"]["fp8"] is False and ddp["step"]["fp8_speedup"] == 1.0
    zero2 = run_json(capsys, REPO / "presets" / "qwen2.5-7b-lora-2node-zero2.yaml", "--gpu", "H100",
                     "--bus-gbps", "400")
    # ZeRO-2 keeps the worker's fast path (0.95x plain DDP measured) but its matmuls in bf16, where plain DDP with
    # its checkpointing runs FP8's auto (1.17x measured with checkpointing): both are advised against
    codes = {a["code"] for a in zero2["advice"]}
    assert {"CKPT_UNNEEDED", "ZERO_NOT_NEEDED"} <= codes
    assert ddp["tokens_per_second"] > zero2["tokens_per_second"]


def test_72b_qlora_fits_four_24gb_gpus_only_with_the_base_sharded(capsys, tmp_path):
    """Qwen's headline: 72B Q-LoRA on four single-GPU nodes of 24 GB. The shipped preset shards the 4-bit base
    under ZeRO-3 and fits 22.5 GiB; the same preset under ZeRO-2 (every GPU holds the whole base) does not, and
    its OOM advice names ZeRO-3 with the figure it reaches."""
    shipped = REPO / "presets" / "qwen2.5-72b-qlora-4x1gpu.yaml"
    z3 = run_json(capsys, shipped, "--gpu-memory-gib", "22.5")
    assert z3["gpu_memory_gb"]["fits"] is True and z3["gpu_memory_gb"]["total"] < 22.5
    assert not [a for a in z3["advice"] if a["level"] == "error"]
    z2_path = tmp_path / "z2.yaml"
    z2_path.write_text(shipped.read_text().replace("zero_stage: 3", "zero_stage: 2"))
    z2 = run_json(capsys, z2_path, "--gpu-memory-gib", "22.5")
    assert z2["gpu_memory_gb"]["fits"] is False and z2["gpu_memory_gb"]["weights"] > 3 * z3["gpu_memory_gb"]["weights"]
    (oom,) = [a for a in z2["advice"] if a["code"] == "OOM"]
    assert oom["fix"]["changes"] == {"training.zero_stage": 3}
    assert "shards the 4-bit base" in oom["fix"]["label"] and f"~{z3['gpu_memory_gb']['total']:.1f} GiB" in oom["fix"]["label"]


def test_without_a_gpu_type_it_says_which_advice_was_not_checked(capsys):
    """No --gpu: not a green "no advice" that reads as "it fits", but which advice needs a GPU type."""
    import inspect

    from qwen_tui.advice import rules as advice
    from qwen_tui.cli.estimate import NEEDS_GPU_MEMORY

    assert main(["estimate", str(PRESET_14B)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal's width
    assert "GPU type unknown: memory fit not checked" in out and "pass --gpu" in out
    assert f"The advice {', '.join(NEEDS_GPU_MEMORY)} and the recommended micro-batch" in out
    # each named code is advice's own, and runs once the memory is known
    src = inspect.getsource(advice)
    assert all(f'"{code}"' in src for code in NEEDS_GPU_MEMORY)
    assert "OOM" in {a["code"] for a in run_json(capsys, PRESET_14B, "--gpu-memory-gib", "8")["advice"]}
    assert main(["estimate", str(PRESET_14B), "--gpu", "H100"]) == 0
    assert "not checked" not in capsys.readouterr().out


def test_an_unmeasured_link_is_not_measured_never_linear(capsys):
    """No --bus-gbps and no facts: past one node the efficiency is unknown, not 100 %."""
    out = run_json(capsys, PRESET_14B, "--gpu", "H100")
    assert out["link_measured"] is False
    assert out["scaling_efficiency"][0]["scaling_efficiency"] == pytest.approx(1.0)
    assert all(p["scaling_efficiency"] is None and p["efficiency_no_overlap"] is None
               for p in out["scaling_efficiency"][1:])
    assert main(["estimate", str(PRESET_14B), "--gpu", "H100"]) == 0
    text = capsys.readouterr().out
    assert "not measured" in text and "100%" not in text.split("│     2 │", 1)[1]
    measured = run_json(capsys, PRESET_14B, "--gpu", "H100", "--bus-gbps", "25")
    assert measured["link_measured"] is True and measured["scaling_efficiency"][1]["scaling_efficiency"] < 1


def test_data_gpu_in_any_case():
    from qwen_tui.cli.main import build_parser

    assert build_parser().parse_args(["data", "p.yaml", "--gpu", "h200"]).gpu == "H200"


def test_a_facts_file_is_the_facts_or_a_check_result_holding_them_and_else_a_clear_refusal(tmp_path):
    facts = ClusterFacts(nodes={0: NodeFacts(hostname="node0")})
    (tmp_path / "facts.json").write_text(json.dumps(facts.to_dict()))
    (tmp_path / "check.json").write_text(json.dumps({"ok": True, "facts": facts.to_dict()}))
    (tmp_path / "bad.json").write_text("[1, 2]")
    for name in ("facts.json", "check.json"):
        assert read_facts_file(str(tmp_path / name)).nodes[0].hostname == "node0"
    for name in ("bad.json", "missing.json"):
        with pytest.raises(ValueError, match=f"{name}: cannot read facts"):
            read_facts_file(str(tmp_path / name))
