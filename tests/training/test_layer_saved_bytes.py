"""The memory estimate's count of what a compiled layer keeps for backward (full fine-tuning) against what torch's
min-cut partitioner, as Inductor calls it, keeps for a real Qwen2 layer: bench/layer_saved_bytes.py on a small
shape, both set-ups the worker runs (bf16 weights; fp32 weights under bf16 autocast). The same script on the 7B and
1.5B shapes gave the figures the estimate was checked with against the worker's memory probes on an H200."""

import sys

import pytest

from qwen_tui.model.spec import spec_from_config
from qwen_tui.plan.estimate import RunShape, _layer_act_bytes
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import layer_saved_bytes as lsb  # bench/ is not a package: on the path above

HIDDEN, INTER, HEADS, KV_HEADS = 256, 704, 4, 2


@pytest.fixture(scope="module")
def small_shape():
    import torch

    # Dynamo's compiled entries for the decoder layer's forward are shared by every test of this process: fresh
    # ones, or another test's could reach its recompile limit and leave this layer eager (and the reverse)
    torch._dynamo.reset()
    lsb.SHAPES["small"] = (HIDDEN, INTER, HEADS, KV_HEADS, 1)
    lsb._register_attention()
    yield "small"
    del lsb.SHAPES["small"]
    torch._dynamo.reset()


@pytest.mark.parametrize("setup", lsb.SETUPS)
def test_the_estimate_counts_what_the_compiled_layer_keeps(small_shape, setup):
    measured = (lsb.saved_bytes(small_shape, setup, 128) - lsb.saved_bytes(small_shape, setup, 64)) / 64
    spec = spec_from_config({"model_type": "qwen2", "hidden_size": HIDDEN, "intermediate_size": INTER,
                             "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "num_hidden_layers": 1,
                             "vocab_size": 256})
    r = 4 if setup == "fp32-autocast" else 2
    compiled = _layer_act_bytes(spec, RunShape(method="full", compiled=True), 2, r)
    eager = _layer_act_bytes(spec, RunShape(method="full", compiled=False), 2, r)
    assert compiled == pytest.approx(measured, rel=0.01), (setup, compiled, measured)
    assert eager > 1.2 * measured  # transformers' eager layer keeps more: the count the fixture's H200 rows check
