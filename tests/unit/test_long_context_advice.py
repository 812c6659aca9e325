"""Long context in the core: training.sequence_parallel_size in the preset (validation naming the field, the
worker's flag, the effective batch), the long-row memory model, and the advice that says before launch when a
record of model_max_length does not fit a GPU (and what would)."""

import pytest

from qwen_tui.advice.rules import advise, apply_fix
from qwen_tui.model.spec import known_spec
from qwen_tui.plan.estimate import GPUS
from qwen_tui.plan.launch import worker_args
from qwen_tui.plan.longcontext import (
    LONG_ROW_TOKENS,
    TILE_FROM_TOKENS,
    heads_problem,
    longest_record,
    row_memory,
    sequence_parallel_problem,
)
from qwen_tui.preset.files import parse_preset
from qwen_tui.preset.schema import Preset, PresetError

H200 = GPUS["H200"].memory_gib


def preset(nodes=1, gpus=1, **training):
    t = dict(model="Qwen/Qwen2.5-7B-Instruct", data="/data/chat.jsonl", method="lora", zero_stage=2,
             model_max_length=131072, per_device_train_batch_size=1, gradient_accumulation_steps=1)
    t.update(training)
    return Preset.model_validate({
        "cluster": {"nodes": [{"host": f"gpu{i}", "gpus": gpus} for i in range(nodes)], "shared_storage": True},
        "training": t})


YAML = """version: 1
cluster:
  nodes:
    - host: gpu0
      gpus: {gpus}
training:
  model: {model}
  data: /data/chat.jsonl
  sequence_parallel_size: {sp}
"""


@pytest.mark.parametrize("gpus,model,sp,message", [
    (4, "Qwen/Qwen2.5-7B-Instruct", 3, "training.sequence_parallel_size: 3 does not divide the 4 GPU(s)"),
    # 28 query heads, 4 key/value heads: 8 ranks cannot split the query heads; 2 and 4 can
    (8, "Qwen/Qwen2.5-7B-Instruct", 8, "the model's 28 attention heads do not divide among 8 ranks (sizes that fit "
                                       "8 GPU(s): 2, 4)"),
    (8, "builtin:tiny", 8, "the model's 4 attention heads do not divide among 8 ranks"),
])
def test_sizes_the_engine_cannot_run_are_refused_naming_the_field(gpus, model, sp, message):
    with pytest.raises(PresetError) as e:
        parse_preset(YAML.format(gpus=gpus, model=model, sp=sp), "p.yaml")
    assert message in str(e.value)


def test_sizes_that_fit_load_and_reach_the_worker():
    p = parse_preset(YAML.format(gpus=8, model="Qwen/Qwen2.5-7B-Instruct", sp=4), "p.yaml")
    a = worker_args(p.training, metrics_file="m")
    assert a[a.index("--sequence_parallel_size") + 1] == "4"
    # Two groups of four GPUs are two replicas of the data: the effective batch counts groups, not GPUs.
    assert p.data_parallel_size == 2 and p.effective_batch_size == 2 * 8
    assert p.batch_formula.endswith("x 2 sequence-parallel groups (8 GPUs / 4 a group) = 16")
    one = parse_preset(YAML.format(gpus=8, model="Qwen/Qwen2.5-7B-Instruct", sp=1), "p.yaml")
    assert "--sequence_parallel_size" not in worker_args(one.training, metrics_file="m")
    assert one.effective_batch_size == 8 * 8
    # Fewer KV heads than ranks: each rank gets a copy (Qwen2.5-7B's 4 KV heads over 4 ranks, Qwen3's 8 over 16).
    assert heads_problem(4, 28, 4) is None and heads_problem(16, 32, 8) is None
    assert heads_problem(8, 32, 6) == "the model's 6 key/value heads and 8 ranks: one must divide the other"
    # A local checkpoint's heads are not read here: the advice (and the worker) check them.
    assert sequence_parallel_problem(8, 8, "/models/mine") is None


def test_long_row_memory_grows_with_the_tokens_and_tiling_and_sp_lower_it():
    spec, t = known_spec("Qwen/Qwen2.5-7B-Instruct"), preset().training
    small, big = row_memory(spec, t, 1, 32768), row_memory(spec, t, 1, 131072)
    assert small.total < big.total and not small.tiled and big.tiled  # tiled from 32k tokens a rank
    untiled = row_memory(spec, t, 1, 131072, tiled=False)
    assert untiled.total > big.total + 10  # the MLP's intermediates of a recomputed layer: tens of GiB at 128k
    # Per token it is the checkpoints and one recomputed layer: hundreds of KB, far below the stock path's full
    # logits (12 x 152k vocabulary = 1.8 MB a token).
    per_token = (row_memory(spec, t, 1, 262144).activations - big.activations) * 2**30 / 131072
    assert 300e3 < per_token < 600e3, per_token
    # Four GPUs a row (ZeRO-3 over them, tiled: the shares are of one width) hold a quarter of the tokens each.
    t4 = preset(gpus=4, zero_stage=3, sequence_parallel_size=4).training
    assert row_memory(spec, t4, 4, 4 * 131072).share == 131072
    one_gpu = longest_record(spec, t, 1, H200)
    assert 128 * 1024 <= one_gpu < 1024 * 1024 and one_gpu % 1024 == 0
    assert row_memory(spec, t, 1, one_gpu).total <= H200 < row_memory(spec, t, 1, one_gpu + 1024).total
    assert longest_record(spec, t4, 4, H200) > 3 * one_gpu
    assert TILE_FROM_TOKENS >= LONG_ROW_TOKENS


def test_a_record_too_long_for_the_gpu_is_an_error_before_launch_with_sequence_parallelism_as_the_fix():
    p = preset(gpus=4, model_max_length=768 * 1024)  # 7B LoRA, ZeRO-2, 4 x H200: 2 GPUs a row are not enough
    adv = {a.code: a for a in advise(p, gpu="H200")}
    assert "OOM" not in adv  # the stock estimate (full logits) does not describe the worker's long rows
    err = adv["LONG_RECORD_OOM"]
    assert err.level == "error" and "model_max_length 786,432 tokens needs" in err.message
    assert "the longest that fits is" in err.message and "tiled MLP" in err.message
    assert err.fix.changes == {"training.sequence_parallel_size": 4}
    fixed = apply_fix(p, err.fix)
    after = {a.code: a for a in advise(fixed, gpu="H200")}
    assert "LONG_RECORD_OOM" not in after and after["LONG_CONTEXT"].level == "info"
    assert "4 GPUs a row" in after["LONG_CONTEXT"].message
    # One GPU: no sequence parallelism to offer; the longest model_max_length that fits instead.
    one = preset(gpus=1, model_max_length=1024 * 1024)
    err = {a.code: a for a in advise(one, gpu="H200")}["LONG_RECORD_OOM"]
    limit = longest_record(known_spec("Qwen/Qwen2.5-7B-Instruct"), one.training, 1, H200)
    assert err.fix.changes == {"training.model_max_length": limit} and f"{limit:,} tokens" in err.message
    assert "LONG_RECORD_OOM" not in [a.code for a in advise(apply_fix(one, err.fix), gpu="H200")]
    # Short rows: the stock rules as before, no long-row advice.
    assert not {"LONG_RECORD_OOM", "LONG_CONTEXT"} & {a.code for a in advise(preset(model_max_length=4096),
                                                                             gpu="H200")}


def test_a_local_checkpoints_heads_and_packing_off_are_advised(tmp_path):
    import json

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
        "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}))
    p = preset(gpus=8, model=str(d), sequence_parallel_size=8, extra_args=["--no_packing"])
    adv = {a.code: a for a in advise(p, gpu="H200")}
    assert "12 attention heads do not divide among 8 ranks" in adv["SP_SHAPE"].message
    assert adv["SP_SHAPE"].fix.changes == {"training.sequence_parallel_size": 4}
    assert adv["SP_NEEDS_PACKING"].fix.changes == {"training.extra_args": []}


def test_the_data_preview_names_the_records_a_gpu_cannot_train():
    from qwen_tui.advice.datapreview import build_report, preview_command, summary_lines

    p = preset(model_max_length=524288)
    counts = {"data": "d.jsonl", "model": "m", "model_max_length": 524288, "records": 100, "usable": 100,
              "dropped": 0, "truncated": 0, "truncated_ids": [], "tokens": 9_000_000, "supervised_tokens": 900_000,
              "length_percentiles": {"p50": 60000, "p90": 200000, "p99": 400000, "max": 410000},
              "histogram": {"edges": [0, 500000], "counts": [100]}, "world_size": 1, "global_batch_size": 1,
              "steps_per_epoch": 100, "total_steps": 100, "records_per_epoch": 100, "tokens_per_epoch": 9_000_000,
              "packing": True, "packing_tokens": 524288, "steps_measured": 100, "padding_waste": 0.0,
              "longer_than": {"tokens": 265216, "records": 7, "longest": 410000}}
    r = build_report(counts, p, None, "", limit=265216, limit_where="H200")
    (err,) = [a for a in r["advice"] if a["code"] == "DATA_TOO_LONG_FOR_GPU"]
    assert err["level"] == "error" and err["message"].startswith("7 record(s) are longer than the 265,216 tokens")
    assert err["fix"]["changes"] == {"training.model_max_length": 265216}
    assert "longest record one GPU trains: 265,216 tokens (H200); 7 longer, the longest has 410,000" in \
        "\n".join(summary_lines(r))
    # Short data: no line, no advice.
    short = build_report({**counts, "longer_than": {"tokens": 265216, "records": 0, "longest": 3000}}, p, None,
                         limit=265216, limit_where="H200")
    assert not [a for a in short["advice"] if a["code"] == "DATA_TOO_LONG_FOR_GPU"]
    assert not any("one GPU trains" in ln for ln in summary_lines(short))
    argv, _ = preview_command(p, longer_than=265216)
    assert argv[argv.index("--longer_than") + 1] == "265216" and argv.index("--longer_than") < argv.index("--")


def test_the_estimate_reports_the_long_row_memory_and_limit():
    from qwen_tui.advice.report import build_report

    p = preset(model_max_length=131072)
    lc = build_report(p, None, gpu="H200")["long_context"]
    spec = known_spec("Qwen/Qwen2.5-7B-Instruct")
    assert lc["long_rows"] is True and lc["tiled_mlp"] is True and lc["sequence_parallel_size"] == 1
    assert lc["longest_record"] == longest_record(spec, p.training, 1, H200)
    assert lc["row_memory_gib"] == pytest.approx(row_memory(spec, p.training, 1, 131072).total, abs=1e-3)
    short = build_report(preset(model_max_length=2048), None)["long_context"]  # no GPU given: no limit
    assert short["long_rows"] is False and short["longest_record"] is None
