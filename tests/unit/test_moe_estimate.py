"""Mixture-of-experts Qwen in the estimator and its advice: total parameters for memory (every expert, sharded as
the ZeRO stage shards it), active parameters for FLOPs, the releases' shapes offline, the pitfalls advised."""

import json

import pytest

from qwen_tui.advice.rules import advise
from qwen_tui.cli.main import main
from qwen_tui.model.spec import KNOWN_MOE, UnknownModel, known_hub_ids, resolve_model, spec_from_config
from qwen_tui.plan.estimate import RunShape, estimate_memory
from qwen_tui.plan.estimate_time import estimate_step, flops_per_token
from qwen_tui.preset.schema import Preset
from support.paths import ROOT as REPO

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _tiny(mtype="qwen3_moe", **kw):
    cfg = {"model_type": mtype, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 24,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "num_experts": 6, "num_experts_per_tok": 2, "vocab_size": 300, "tie_word_embeddings": False}
    if mtype == "qwen2_moe":
        cfg["shared_expert_intermediate_size"] = 40
    cfg.update(kw)
    return cfg


def _build(cfg, device="cpu"):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device(device):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))


@pytest.mark.parametrize("cfg", [
    _tiny(),
    _tiny(tie_word_embeddings=True),
    _tiny(mlp_only_layers=[0, 2]),  # two dense MLP layers among the sparse ones
    _tiny(decoder_sparse_step=2),  # every second layer sparse
    _tiny("qwen2_moe"),  # a shared expert beside the routed ones, q/k/v biases
    _tiny("qwen2_moe", qkv_bias=False),
], ids=["qwen3-moe", "tied", "mlp-only-layers", "sparse-step", "qwen2-moe", "qwen2-moe-no-bias"])
def test_counts_match_transformers_and_peft(cfg):
    """Total parameters as transformers builds them; LoRA on attention and on every expert (peft's
    target_parameters on the fused weights, the shared expert's modules) as peft counts them."""
    from peft import LoraConfig, get_peft_model

    model = _build(cfg)
    spec = spec_from_config(cfg)
    assert spec.is_moe and spec.total_params == model.num_parameters()
    if spec.moe_layers < spec.layers:
        # peft 0.21 neither adapts the dense layers' MLPs beside fused experts nor keeps the experts' rank there;
        # no Qwen release mixes them: only the count above is checked
        return
    modules = ATTN + (["gate_proj", "up_proj", "down_proj"] if cfg["model_type"] == "qwen2_moe" else [])
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=modules, target_parameters=[
        "mlp.experts.gate_up_proj", "mlp.experts.down_proj"]))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert spec.lora_params(4) == trainable
    assert spec.lora_params(4, ATTN) < spec.lora_params(4)


@pytest.mark.parametrize("base,total,active", [
    ("qwen3-30b-a3b", 30_532_122_624, 3.35e9),  # Qwen's card: 30.5B, 3.3B activated
    ("qwen3-235b-a22b", 235_093_634_560, 22.19e9),  # 235B, 22B activated
    ("qwen2-57b-a14b", 57_408_658_944, 14.25e9),  # 57B, 14B activated
])
def test_releases_resolve_offline_with_transformers_counts(base, total, active):
    """The releases' shapes (their config.json files) give transformers' own count, built on the meta device."""
    model = _build(KNOWN_MOE[base], device="meta")
    spec = resolve_model(f"Qwen/{base}")
    assert spec.total_params == model.num_parameters() == total
    assert spec.active_params == pytest.approx(active, rel=2e-3)
    assert spec.active_matmul_params < spec.active_params < spec.total_params


def test_hub_id_suffixes_and_local_configs(tmp_path):
    a = resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507")
    assert (a.experts, a.experts_per_token, a.moe_intermediate, a.layers) == (128, 8, 768, 48)
    assert resolve_model("qwen/qwen3-30b-a3b-thinking-2507").total_params == a.total_params
    fp8 = resolve_model("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8")
    assert fp8.quant_method == "fp8" and fp8.experts == 128
    q2 = resolve_model("Qwen/Qwen2-57B-A14B-Instruct")
    assert q2.shared_intermediate == 20480 and q2.qkv_bias and not q2.qk_norm
    # transformers 5 writes num_local_experts in a saved config.json
    cfg = {**KNOWN_MOE["qwen3-30b-a3b"], "num_local_experts": 128}
    del cfg["num_experts"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert resolve_model(str(tmp_path)).total_params == a.total_params
    with pytest.raises(UnknownModel, match="experts"):
        spec_from_config({**cfg, "model_type": "qwen2"})
    assert {"Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B", "Qwen/Qwen2-57B-A14B-Instruct"} <= set(known_hub_ids())


def test_memory_counts_every_expert_and_flops_the_active_ones():
    spec = resolve_model("Qwen/Qwen3-30B-A3B")
    full = RunShape(method="full", zero_stage=3, seq=4096, micro_batch=1, gradient_checkpointing=False)
    m16 = estimate_memory(spec, full, 16)
    # DeepSpeed ZeRO-3: 4 bytes of gradient and 12 of fp32 master + Adam per parameter, every expert's, over 16
    assert m16.gradients * 2**30 == pytest.approx(4 * spec.total_params / 16, rel=1e-6)
    assert m16.optimizer * 2**30 == pytest.approx(12 * spec.total_params / 16, rel=1e-6)
    assert estimate_memory(spec, full, 32).optimizer == pytest.approx(m16.optimizer / 2, rel=1e-6)
    # ZeRO-2 shards gradients and optimizer states, not the bf16 weights: all 61 GB of them on every GPU
    z2 = estimate_memory(spec, RunShape(method="lora", zero_stage=2, lora_targets=tuple(ATTN)), 16)
    assert z2.weights * 2**30 > 2 * spec.total_params
    # a token's FLOPs: 6 x the parameters it multiplies (8 of 128 experts) + attention, not 6 x 30.5B
    fpt = flops_per_token(spec, full)
    assert fpt == pytest.approx(6 * spec.active_matmul_params + 12 * spec.layers * 4096 * spec.q_dim)
    assert spec.active_matmul_params == pytest.approx(3.04e9, rel=2e-3)  # what MFU on active parameters counts
    lora = RunShape(method="lora", zero_stage=3, gradient_checkpointing=False)  # every expert adapted
    extra = flops_per_token(spec, lora) - flops_per_token(spec, RunShape(method="lora", zero_stage=3,
                                                                         gradient_checkpointing=False, lora_r=1,
                                                                         lora_targets=("q_proj",)))
    assert extra < 4 * 2 * spec.lora_params(64, active=True) + 4 * 2 * spec.lora_params(1, ["q_proj"])
    step = estimate_step(spec, full, 2, 8, 400)
    assert step.comm_bytes_per_gpu > 2 * 2 * spec.total_params * 15 / 16  # ZeRO-3 gathers all weights, twice


def _preset(model, method="lora", zero_stage=3, nodes=2, **t):
    return Preset.model_validate({
        "cluster": {"nodes": [{"host": f"gpu{i}", "gpus": 8} for i in range(nodes)], "shared_storage": True},
        "training": {"model": model, "data": "/data/chat.jsonl", "method": method, "zero_stage": zero_stage,
                     "model_max_length": 4096, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8,
                     **t}})


def test_advice_covers_the_moe_pitfalls():
    def by(p):
        return {a.code: a for a in advise(p, gpu="H100")}

    a = by(_preset("Qwen/Qwen3-30B-A3B", method="qlora", zero_stage=2))
    assert a["MOE_QLORA"].level == "error" and "bitsandbytes cannot quantize" in a["MOE_QLORA"].message
    assert a["MOE_QLORA"].fix.changes == {"training.method": "lora", "training.zero_stage": 3}
    default_targets = by(_preset("Qwen/Qwen3-30B-A3B", lora_dropout=0.0))
    assert default_targets["MOE_LORA_EXPERTS"].level == "warning"
    assert "all 128 experts" in default_targets["MOE_LORA_EXPERTS"].message
    assert "2.6B trainable" in default_targets["MOE_LORA_EXPERTS"].message
    assert default_targets["MOE_LORA_EXPERTS"].fix.changes == {"training.lora_target_modules": ATTN}
    with_dropout = by(_preset("Qwen/Qwen3-30B-A3B", lora_dropout=0.05))["MOE_LORA_EXPERTS"]
    assert with_dropout.level == "warning" and "lora_dropout 0.05 applies to the attention's adapters only" in \
        with_dropout.message
    assert with_dropout.fix.changes == {"training.lora_target_modules": ATTN}
    assert "leaf module" in default_targets["MOE_ZERO3"].message and "MOE_ROUTING" in default_targets
    attention = by(_preset("Qwen/Qwen3-30B-A3B", lora_target_modules=ATTN, zero_stage=2))
    assert "MOE_LORA_EXPERTS" not in attention and "MOE_ZERO3" not in attention and "MOE_QLORA" not in attention
    dense = by(_preset("Qwen/Qwen2.5-7B-Instruct"))
    assert not [c for c in dense if c.startswith("MOE_")]


def _json(capsys, path, *argv):
    assert main(["estimate", str(path), "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_shipped_moe_presets_estimate_with_memory_broken_down(capsys):
    r30 = _json(capsys, REPO / "presets" / "qwen3-30b-a3b-lora-2node-zero3.yaml", "--gpu", "H100",
                "--bus-gbps", "400")
    assert r30["model"]["moe"] == {"experts": 128, "experts_per_token": 8, "moe_intermediate_size": 768,
                                   "shared_expert_intermediate_size": 0, "moe_layers": 48}
    assert r30["model"]["active_params"] < r30["model"]["params"] / 9
    mem = r30["gpu_memory_gb"]
    assert mem["fits"] is True and {"weights", "gradients", "optimizer", "activations", "logits"} <= set(mem)
    r235 = _json(capsys, REPO / "presets" / "qwen3-235b-a22b-lora-4node-zero3.yaml", "--gpu", "H100",
                 "--bus-gbps", "3200")
    assert r235["gpu_memory_gb"]["fits"] is True
    assert not [a for a in r235["advice"] if a["level"] == "error"]


def test_235b_full_fine_tuning_does_not_fit_eight_nodes_and_the_advice_says_what_would(capsys, tmp_path):
    """Full fine-tuning of Qwen3-235B-A22B under ZeRO-3 on 8 nodes of 8 x 80 GB: 18 bytes a parameter over 64
    GPUs plus the gathered layers is more than 80 GB; the OOM advice names a change that fits."""
    text = (REPO / "presets" / "qwen3-235b-a22b-lora-4node-zero3.yaml").read_text()
    nodes = "".join(f"  - {{host: gpu-node-{i}, user: ubuntu, gpus: 8}}\n" for i in range(1, 9))
    head, rest = text.split("  nodes:\n", 1)
    rest = rest[rest.index("  shared_storage"):]
    p = tmp_path / "full.yaml"
    p.write_text((head + "  nodes:\n" + nodes + rest).replace("method: lora", "method: full")
                 .replace("per_device_train_batch_size: 4", "per_device_train_batch_size: 1"))
    r = _json(capsys, p, "--gpu", "H100", "--bus-gbps", "3200")
    assert r["world_size"] == 64 and r["gpu_memory_gb"]["fits"] is False
    (oom,) = [a for a in r["advice"] if a["code"] == "OOM"]
    assert oom["fix"] is not None and oom["fix"]["changes"]


@pytest.mark.parametrize("name,kind", [("builtin:tiny-moe", "qwen3_moe"), ("builtin:tiny-qwen2-moe", "qwen2_moe")])
def test_builtin_tiny_moe_matches_training_tiny(name, kind):
    from training.model import tiny

    spec = resolve_model(name)
    cfg = tiny._config(kind, vocab_size=tiny.VOCAB_SIZE, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2)
    assert tiny.BUILTINS[name] == kind == spec.architecture
    assert (spec.experts, spec.experts_per_token, spec.moe_intermediate) == (
        cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size)
    assert spec.shared_intermediate == (getattr(cfg, "shared_expert_intermediate_size", 0) or 0)
    assert (spec.hidden, spec.layers, spec.head_dim) == (64, 2, getattr(cfg, "head_dim", None) or 64 // 4)
