"""The model's size as the estimate and the Training step say it: in the unit that shows it, so the tiny demo
model reads '139.8 K parameters', never '0.00 B parameters'."""

from qwen_tui.advice.report import human_count, model_line


def test_counts_take_the_unit_that_shows_them():
    assert human_count(7_615_616_512) == "7.62 B"
    assert human_count(1_310_720) == "1.3 M"
    assert human_count(139_776) == "139.8 K"
    assert human_count(640) == "640"


def test_a_tiny_dense_model_and_a_mixture_of_experts():
    assert model_line({"params": 139_776}) == "139.8 K parameters"
    moe = {"experts": 128, "experts_per_token": 8}
    assert model_line({"params": 30_532_122_624, "active_params": 3_345_000_000, "moe": moe}) == (
        "30.53 B parameters, 3.35 B active a token (8 of 128 experts)")
    tiny_moe = {"experts": 8, "experts_per_token": 2, "shared_expert_intermediate_size": 64}
    assert model_line({"params": 420_000, "active_params": 180_000, "moe": tiny_moe}) == (
        "420.0 K parameters, 180.0 K active a token (2 of 8 experts, + a shared expert)")
