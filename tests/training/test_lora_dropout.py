"""training.fast.lora_dropout: LoRA's dropout inside the Triton kernel of lora_A.

The kernels run here in Triton's CPU interpreter (TRITON_INTERPRET=1, float32: the interpreter has no bf16
matmul), in a subprocess because the interpreter is chosen when the kernels are defined. The bf16 kernels, their
speed and the loss curve on a GPU are bench/lora_dropout_kernel.py's."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn as nn

from support.worker import decide_for, run_interpreted

_INTERPRETED = textwrap.dedent("""
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from training.fast import lora_dropout as L

    out = []
    for m, k, r, p in [(150, 72, 8, 0.3), (70, 520, 16, 0.05), (64, 44, 4, 0.5)]:
        g = torch.Generator().manual_seed(m + k)
        x = torch.randn(m, k, generator=g, requires_grad=True)
        a = torch.randn(r, k, generator=g, requires_grad=True)
        gh = torch.randn(m, r, generator=g)
        seed = torch.tensor([123456789 + k], dtype=torch.int64)
        thr, scale = L.threshold(p)
        keep = L.mask((m, k), seed, p).float()
        h = L.lora_dropout_a(x, a, seed, p)          # through the registered autograd
        h.backward(gh)
        xr, ar = x.detach().clone().requires_grad_(), a.detach().clone().requires_grad_()
        ((xr * keep * scale) @ ar.t()).backward(gh)
        ref_h = (xr * keep * scale) @ ar.t()
        dx0, da0 = L.lora_dropout_a_backward(gh, x.detach(), a.detach(), seed, p, False)
        out.append(dict(
            shape=[m, k, r], p=p,
            h=((h - ref_h).abs().max() / ref_h.abs().max()).item(),
            dx=((x.grad - xr.grad).abs().max() / xr.grad.abs().max()).item(),
            da=((a.grad - ar.grad).abs().max() / ar.grad.abs().max()).item(),
            da_without_dx=((da0 - ar.grad).abs().max() / ar.grad.abs().max()).item(), dx_skipped=dx0.numel(),
            same_seed=bool(torch.equal(L.mask((m, k), seed, p), L.mask((m, k), seed, p))),
            other_seed_agree=(L.mask((m, k), seed + 1, p).float() == keep).float().mean().item(),
        ))
    big = torch.tensor([7], dtype=torch.int64)
    share = L.mask((512, 1024), big, 0.05).float().mean().item()
    # Under torch.compile (dynamic shapes, AOTAutograd) the op runs through its fake implementation and autograd.
    x = torch.randn(40, 72, requires_grad=True)
    a = torch.randn(8, 72, requires_grad=True)
    seed = torch.tensor([99], dtype=torch.int64)
    f = torch.compile(lambda x, a: (L.lora_dropout_a(x, a, seed, 0.2) ** 2).sum(), backend="aot_eager", dynamic=True)
    f(x, a).backward()
    gx, ga = x.grad.clone(), a.grad.clone()
    x.grad = a.grad = None
    (L.lora_dropout_a(x, a, seed, 0.2) ** 2).sum().backward()
    compiled = max((gx - x.grad).abs().max().item(), (ga - a.grad).abs().max().item())
    print(json.dumps(dict(cases=out, share=share, compiled=compiled)))
""")


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED)


def test_kernels_match_dropout_then_matmul_with_their_own_mask(interpreted):
    for c in interpreted["cases"]:
        assert c["h"] < 1e-5 and c["dx"] < 1e-5 and c["da"] < 1e-5, c
        # Without dx the kernel still gives the same dA, and writes no dx.
        assert c["da_without_dx"] < 1e-5 and c["dx_skipped"] == 0, c
        assert c["same_seed"], c
        # Another seed draws another mask: for p = 0.3, two masks agree on about 0.7^2 + 0.3^2 = 58% of elements.
        expected = (1 - c["p"]) ** 2 + c["p"] ** 2
        assert abs(c["other_seed_agree"] - expected) < 0.08, c
    # The mask kernel tiles 32 rows, the others 64: the same mask, so it does not depend on the tiling.


def test_keep_share_is_one_minus_p(interpreted):
    # 524,288 draws: the standard deviation of the share is 0.0003 at p = 0.05.
    assert abs(interpreted["share"] - (1 - 0.05)) < 0.0015


def test_compiled_graph_gives_the_eager_gradients(interpreted):
    assert interpreted["compiled"] < 1e-5


def test_threshold_rounds_p_to_lanes_and_scales_to_keep_the_expectation():
    from training.fast.lora_dropout import LANE_RANGE, threshold

    thr, scale = threshold(0.05)
    assert thr == 3277 and scale == pytest.approx(1 / (1 - 3277 / LANE_RANGE))
    assert threshold(0.0) == (0, 1.0)
    with pytest.raises(ValueError, match="outside"):
        threshold(1.0)


def _peft_model():
    from peft import LoraConfig, get_peft_model

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(16, 16)
            self.down = nn.Linear(16, 8)

        def forward(self, x):
            return self.down(torch.relu(self.q(x)))

    torch.manual_seed(0)
    m = get_peft_model(Two(), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.25, target_modules=["q", "down"]))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_()  # peft starts B at zero, which would hide the adapters
    return m


def test_fusing_keeps_parameters_names_and_the_off_gpu_output():
    from training.fast.lora_dropout import DropoutLoraA, fuse_lora_dropout

    ref, fused = _peft_model(), _peft_model()
    params = {n: p for n, p in fused.named_parameters()}
    assert fuse_lora_dropout(fused) == 2
    assert fuse_lora_dropout(fused) == 0  # the dropout is gone: nothing left to fuse
    assert isinstance(fused.base_model.model.q.lora_A["default"], DropoutLoraA)
    assert isinstance(fused.base_model.model.q.lora_dropout["default"], nn.Identity)
    # The same Parameter objects under the same names: the optimizer, checkpoints and saved adapters are unchanged.
    assert {n: id(p) for n, p in fused.named_parameters()} == {n: id(p) for n, p in params.items()}
    assert sorted(fused.state_dict()) == sorted(ref.state_dict())
    x = torch.randn(5, 16)
    for mode in ("train", "eval"):
        getattr(ref, mode)()
        getattr(fused, mode)()
        torch.manual_seed(3)
        a = ref(x)
        torch.manual_seed(3)
        b = fused(x)
        assert torch.equal(a, b), mode  # off CUDA: the same dropout draws, then the same matmul
    assert not torch.equal(ref.train()(x), ref.eval()(x))  # the dropout did drop something in training


def test_fusing_leaves_adapters_without_dropout_alone():
    from peft import LoraConfig, get_peft_model

    from training.fast.lora_dropout import fuse_lora_dropout

    m = get_peft_model(nn.Sequential(nn.Linear(8, 8)), LoraConfig(r=2, lora_dropout=0.0, target_modules=["0"]))
    assert fuse_lora_dropout(m) == 0


def _decide(argv, device="cpu", deepspeed=False):
    return decide_for(argv, device, deepspeed)


def test_fused_dropout_is_decided_with_its_reason_and_refused_where_it_cannot_run():
    from training.runtime.errors import InputError

    assert _decide(["--use_lora"]).why["fused_lora_dropout"].startswith("off: opt-in")
    assert not _decide(["--use_lora"]).fused_lora_dropout
    assert not _decide(["--use_lora"], device="cuda").fused_lora_dropout  # opt-in on a GPU too
    assert _decide([]).why["fused_lora_dropout"] == "n/a: no adapters"
    assert _decide(["--use_lora", "--lora_dropout", "0"]).why["fused_lora_dropout"] == "n/a: --lora_dropout 0"
    assert "fused LoRA dropout off" in _decide(["--use_lora"]).summary()
    with pytest.raises(InputError, match="--fused_lora_dropout runs a Triton kernel: it needs a CUDA GPU"):
        _decide(["--use_lora", "--fused_lora_dropout"])
    with pytest.raises(InputError, match="needs --use_lora or --q_lora"):
        _decide(["--fused_lora_dropout"])
    assert _decide(["--use_lora", "--no_fused_lora_dropout"]).why["fused_lora_dropout"] == "as given"
