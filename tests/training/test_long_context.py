"""Long records on one GPU: the tiled MLP (--tiled_mlp, training.fast.long_context) on CPU with the tiny model.

Tiling changes where the MLP's activations live, not what is computed: the worker's curve with tiles of 64
tokens on rows of 350-600 tokens must be the untiled one's; LoRA dropout inside a tile draws the same masks
when the tile is recomputed in the backward as in its forward (otherwise the gradient would be of another
forward than the loss's).
"""

from __future__ import annotations

import pytest
import torch

from support.long_records import STEPS, flags
from support.worker import assert_ok, run_worker
from training.fast import long_context
from training.runtime.errors import InputError


def test_tile_counts_are_the_ones_torch_chunk_makes():
    for width in range(1, 400):
        for tile in (1, 3, 4, 7, 64):
            n = long_context._tile_count(width, tile)
            chunks = torch.chunk(torch.empty(width), n)
            assert len(chunks) == n and max(len(c) for c in chunks) <= tile, (width, tile, n)


def test_lora_dropout_in_a_recomputed_tile_uses_the_forwards_masks(tiny_model):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5,
                                            target_modules=["gate_proj", "up_proj", "down_proj"]))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)  # B = 0 would hide the adapters from the gradient
    mlp = model.get_base_model().model.layers[0].mlp
    plain = type(mlp).forward
    x = torch.randn(1, 50, base.config.hidden_size, requires_grad=True)
    g_out = torch.randn(1, 50, base.config.hidden_size)
    params = [p for p in mlp.parameters() if p.requires_grad]

    assert long_context.tile_mlps(model, 16) == base.config.num_hidden_layers
    torch.manual_seed(123)
    out = mlp(x)
    # TiledMLP reaches the weights' gradients through its own backward (not the graph of `out`): .grad, as in training
    out.backward(g_out)
    grads = [t.grad.clone() for t in (x, *params)]

    # By hand: the seed the tiled call drew, then every tile forward and backward with its own seed.
    torch.manual_seed(123)
    seed = int(torch.randint(0, 2**62, (1,)).item())
    tiles = long_context._tile_count(50, 16)
    outs, ref = [], [torch.zeros_like(t) for t in (x, *params)]
    for i, (xs, gs) in enumerate(zip(torch.chunk(x, tiles, dim=1), torch.chunk(g_out, tiles, dim=1))):
        torch.manual_seed(seed + i)
        o = plain(mlp, xs)
        outs.append(o)
        for acc, g in zip(ref, torch.autograd.grad(o, [x, *params], gs, allow_unused=True)):
            acc += g if g is not None else 0.0
    torch.testing.assert_close(out, torch.cat(outs, dim=1))
    for got, want in zip(grads, ref):
        torch.testing.assert_close(got, want)
    # Dropout really drew masks: another seed gives another output.
    torch.manual_seed(124)
    assert not torch.allclose(mlp(x), out)
    with torch.no_grad():  # evaluation runs the MLP as it was
        torch.manual_seed(5)
        model.eval()
        torch.testing.assert_close(mlp(x), plain(mlp, x))


def test_a_tile_recomputed_in_the_backward_runs_under_the_forwards_autocast(tiny_model):
    """Under autocast an fp32 layer takes the bf16 hidden states of the layer before; the backward runs with autocast
    off, so a recomputed tile outside the forward's autocast met bf16 inputs with fp32 weights (a dtype error on the
    GPU from 64k-token records on). On CPU's bf16 autocast the same mix must train, with the untiled gradients."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["gate_proj", "up_proj", "down_proj"]))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)
    mlp = model.get_base_model().model.layers[0].mlp
    plain = type(mlp).forward
    x = torch.randn(1, 48, base.config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    params = [p for p in mlp.parameters() if p.requires_grad]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.autograd.grad(plain(mlp, x).float().sum(), [x, *params])
    assert long_context.tile_mlps(model, 16) == base.config.num_hidden_layers
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mlp(x)
    out.float().sum().backward()
    for got, ref in zip([x.grad, *[p.grad for p in params]], want):
        # bf16 sums tile by tile in another order: the same gradient to bf16's precision, not bit for bit
        err = (got.float() - ref.float()).norm() / ref.float().norm()
        assert got.dtype == ref.dtype and err < 2e-2, (got.shape, float(err))


def _decided(argv, world=1, stage=None, deepspeed=False, device="cpu"):
    from support.worker import decide_for, parsed_flags
    from training.flags import Resolved

    args = parsed_flags(argv)
    fast = decide_for(argv, device=device, deepspeed=deepspeed, zero_stage=stage or 2)
    resolved = Resolved.of(args)
    long_context.decide(resolved, fast, world, stage, deepspeed, train=args.train, given=args.fast,
                        max_length=args.data.model_max_length, sequences=2 if args.pref.stage == "dpo" else 1)
    # what set-up decides goes into its own record: the flags stay as they were given
    assert (args.train.tiled_mlp, args.fast.packing_tokens) == (parsed_flags(argv).train.tiled_mlp,
                                                                parsed_flags(argv).fast.packing_tokens)
    assert args.train.gradient_checkpointing == parsed_flags(argv).train.gradient_checkpointing
    return resolved, fast


@pytest.mark.parametrize("argv,world,stage,deepspeed,message", [
    (["--tiled_mlp"], 2, None, False, "--tiled_mlp under plain DDP is not supported"),
    (["--tiled_mlp", "--sequence_parallel_size", "2"], 4, 3, True,
     "--tiled_mlp under ZeRO-3 needs every rank to run rows of one width: use it with --sequence_parallel_size 4"),
    (["--tiled_mlp", "--tiled_mlp_tokens", "0"], 1, None, False, "--tiled_mlp_tokens must be positive"),
])
def test_tiled_mlp_where_it_cannot_run_is_refused(argv, world, stage, deepspeed, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        _decided(argv, world, stage, deepspeed)


def test_long_records_tile_the_mlp_and_skip_the_memory_probe_by_default():
    # A rank's share over 32k tokens: tiled where it can run, with the reason recorded.
    resolved, fast = _decided(["--model_max_length", "131072"])
    assert resolved.tiled_mlp is True and fast.why["tiled_mlp"] == "on: records of up to 131072 tokens a rank"
    resolved, fast = _decided(["--model_max_length", "131072", "--sequence_parallel_size", "4"], world=4, stage=2,
                          deepspeed=True)
    assert resolved.tiled_mlp is False and "32768 tokens a rank" in fast.why["tiled_mlp"]
    resolved, fast = _decided(["--model_max_length", "131072"], world=2)  # plain DDP: cannot, so off, saying why
    assert resolved.tiled_mlp is False and fast.why["tiled_mlp"].startswith("off: cannot run here (--tiled_mlp under")
    resolved, fast = _decided(["--model_max_length", "4096"])
    assert resolved.tiled_mlp is False and resolved.packing_tokens is None
    # On CUDA the probe would run a row of two longest records: one record a row, checkpointed, instead.
    resolved, fast = _decided(["--model_max_length", "131072", "--packing", "--compile"], device="cuda")
    assert fast.auto_micro_batch is False and resolved.packing_tokens == 131072
    assert resolved.gradient_checkpointing is True
    assert "past what the probe measures" in fast.why["auto_micro_batch"]
    assert fast.compile is True  # asked for: kept
    resolved, fast = _decided(["--model_max_length", "16384", "--packing"], device="cuda")
    assert fast.auto_micro_batch is True and resolved.packing_tokens is None and resolved.tiled_mlp is False
    # DPO's probe rows hold one and two pairs of two answers: past --auto_max_tokens at half SFT's length, and the
    # row without the probe holds one pair
    resolved, fast = _decided(["--model_max_length", "32768", "--packing"], device="cuda")
    assert fast.auto_micro_batch is True and resolved.packing_tokens is None
    resolved, fast = _decided(["--model_max_length", "32768", "--packing", "--stage", "dpo"], device="cuda")
    assert fast.auto_micro_batch is False and resolved.packing_tokens == 65536
    assert "rows of one pair of such answers" in fast.why["auto_micro_batch"]


@pytest.mark.slow
def test_tiled_mlp_keeps_the_one_process_curve(tmp_path, long_files, long_one):
    # With checkpointed layers: each layer's recomputation runs the tiled MLP again (tiles reseeded alike).
    run = run_worker(tmp_path / "out", *flags(long_files, "--tiled_mlp", "--tiled_mlp_tokens", "64",
                                              "--gradient_checkpointing"))
    assert_ok(run)
    assert "tiled MLP: 2 layers, tiles of 64 tokens" in run.stderr
    assert run.records[0]["fast_path"]["gradient_checkpointing"] is True
    for a, b in zip(run.steps, long_one.steps, strict=True):
        # The same sums over other row splits of the MLP's matmuls (float32): far below any real difference.
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), (a, b)
    assert len(run.steps) == STEPS
