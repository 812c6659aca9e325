"""ModelSpec: exact parameter counts from config.json shapes, offline resolution, unknown models."""

import json

import pytest

from qwen_tui.model.spec import KNOWN, UnknownModel, known_spec, resolve_model, spec_from_config

# Counted by transformers on the H200 (tests/fixtures/README.md).
FIXTURE_COUNTS = {
    "Qwen/Qwen2.5-1.5B-Instruct": (1_543_714_304, 73_859_072),
    "Qwen/Qwen2.5-7B-Instruct": (7_615_616_512, 161_480_704),
}


@pytest.mark.parametrize("hub_id", sorted(FIXTURE_COUNTS))
def test_fixture_param_counts(hub_id):
    spec = resolve_model(hub_id)
    base, lora = FIXTURE_COUNTS[hub_id]
    assert spec.total_params == base
    assert spec.lora_params(64) == lora


def _config(**kw):
    cfg = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "tie_word_embeddings": False}
    cfg.update(kw)
    return cfg


def _transformers_count(cfg):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    return model.num_parameters()


@pytest.mark.parametrize("cfg", [
    _config(),
    _config(tie_word_embeddings=True),
    _config(model_type="qwen3", head_dim=24, num_attention_heads=4, num_key_value_heads=1),
    _config(model_type="qwen3", attention_bias=True, tie_word_embeddings=True),
])
def test_counts_match_transformers(cfg):
    """Qwen2 biases, Qwen3 q/k norms and explicit head_dim, tied or not: the count is what transformers builds."""
    assert spec_from_config(cfg).total_params == _transformers_count(cfg)


def test_lora_count_matches_peft():
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = _config()
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert spec_from_config(cfg).lora_params(8, ["q_proj", "v_proj", "down_proj"]) == trainable


def test_builtin_tiny_matches_training_tiny():
    from training.model import tiny

    spec = resolve_model("builtin:tiny")
    assert (spec.hidden, spec.layers, spec.heads, spec.kv_heads, spec.vocab) == (64, 2, 4, 2, tiny.VOCAB_SIZE)
    assert spec.tied_embeddings


def test_hub_ids_resolve_offline_with_suffixes():
    assert resolve_model("Qwen/Qwen2.5-72B-Instruct").layers == 80
    assert known_spec("qwen/qwen3-8b").qk_norm
    q = resolve_model("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4")
    assert q.quantized and q.quant_method == "gptq" and q.quant_bits == 4
    assert q.total_params == resolve_model("Qwen/Qwen2.5-7B").total_params
    assert not resolve_model("Qwen/Qwen2.5-7B-Instruct").quantized
    assert len(KNOWN) >= 10


def test_local_directory_config(tmp_path):
    cfg = _config(quantization_config={"quant_method": "awq", "bits": 4})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = resolve_model(str(tmp_path))
    assert spec.quant_method == "awq" and spec.hidden == 64


@pytest.mark.parametrize("name", ["meta-llama/Llama-3-8B", "builtin:huge", "/nonexistent/model", "Qwen/Qwen9-1B"])
def test_unknown_models_raise_unknownmodel(name):
    with pytest.raises(UnknownModel):
        resolve_model(name)


def test_other_architectures_and_incomplete_moe_configs_are_unknown():
    with pytest.raises(UnknownModel):  # no num_experts_per_tok / moe_intermediate_size (test_moe_estimate: complete)
        spec_from_config(_config(model_type="qwen2_moe", num_experts=8))
    with pytest.raises(UnknownModel):  # experts in a dense model type
        spec_from_config(_config(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16))
    with pytest.raises(UnknownModel):
        spec_from_config(_config(model_type="llama"))
    with pytest.raises(UnknownModel):
        spec_from_config({"model_type": "qwen2"})
