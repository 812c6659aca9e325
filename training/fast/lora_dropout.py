"""LoRA's dropout fused into the adapter's first matmul (lora_A) on CUDA: --fused_lora_dropout.

peft computes every adapter as lora_B(lora_A(dropout(x))). The dropout is a kernel of its own per adapted
projection (seven a layer, three of them on the same input) that reads x and writes the dropped copy and a
mask, and both stay alive until the backward. On the 7B shape that is 3.7% of a step's GPU time and about
2 GB of saved activations a layer for a 17k-token row (a profiled step of bench/train_speed.py).

Here one Triton kernel reads x once, draws the mask in registers and multiplies by A:
    h = (x * keep / (1 - p)) @ A.T
and one backward kernel draws the same mask again from the same seed:
    dx = ((dh @ A) * keep / (1 - p)),   dA = dh.T @ (x * keep / (1 - p))
Nothing but x (which the base projection's input already is) and a seed is kept for the backward.

The mask: Philox (Triton's randint4x, 10 rounds) keyed by a seed drawn from torch's CUDA generator for each
call (so --seed and resumed RNG state govern it), counter (row, column // 8); the four 32-bit words give eight
16-bit lanes, and an element is kept when its lane is >= round(p * 65536). The drop probability is therefore
p rounded to 1/65536 (0.05 -> 0.0500031), and the kept values are scaled by 1 / (1 - that), so the expectation
is exact. The masks differ from torch's dropout (another generator), not their distribution: a run with the
fused kernel follows the plain run's loss curve within dropout's own noise (bench/lora_dropout_kernel.py).

Measured on an H200 (bench/lora_dropout_kernel.py; bench/README.md names its result): 27% less activation memory
a token on the 7B shape, and the same step time as peft's dropout (the kernels beat it in isolation, but in the compiled step Inductor
already folds the dropout's backward into its neighbours). So the switch is opt-in, for runs short of memory.
"""

from __future__ import annotations

import importlib.util
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

LANES = 8  # 16-bit lanes per Philox call (four 32-bit words)
LANE_RANGE = 1 << 16

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (CPU-only torch): the module falls back to dropout + linear
    triton = None


def available(device: torch.device) -> bool:
    """The fused kernels need Triton and a CUDA device."""
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


def threshold(p: float) -> tuple[int, float]:
    """(lane threshold, scale of kept values) for drop probability p."""
    thr = int(round(p * LANE_RANGE))
    if not 0 <= thr < LANE_RANGE:
        raise ValueError(f"dropout probability {p} is outside [0, 1)")
    return thr, LANE_RANGE / (LANE_RANGE - thr)


if triton is not None:

    @triton.jit
    def _keep(seed, rows, k0, KG, thr, BM: tl.constexpr, BK: tl.constexpr):
        """The keep mask of rows `rows` x columns k0 .. k0 + BK (k0 a multiple of 8): (BM, BK) booleans."""
        group = rows[:, None] * KG + (k0 // 8 + tl.arange(0, BK // 8))[None, :]
        r0, r1, r2, r3 = tl.randint4x(seed, group)
        w01 = tl.join(tl.join(r0 & 0xFFFF, (r0 >> 16) & 0xFFFF), tl.join(r1 & 0xFFFF, (r1 >> 16) & 0xFFFF))
        w23 = tl.join(tl.join(r2 & 0xFFFF, (r2 >> 16) & 0xFFFF), tl.join(r3 & 0xFFFF, (r3 >> 16) & 0xFFFF))
        lanes = tl.reshape(tl.join(w01, w23), (BM, BK))
        return lanes >= thr

    @triton.jit
    def _mask_kernel(out_ptr, seed_ptr, M, K, KG, thr, BM: tl.constexpr, BK: tl.constexpr):
        """The mask itself, for tests and the benchmark's reference."""
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        k0 = tl.program_id(1) * BK
        cols = k0 + tl.arange(0, BK)
        keep = _keep(tl.load(seed_ptr), rows, k0, KG, thr, BM, BK)
        tl.store(out_ptr + rows[:, None] * K + cols[None, :], keep.to(tl.int8),
                 mask=(rows[:, None] < M) & (cols[None, :] < K))

    def _fwd_configs():
        return [triton.Config({"BM": bm, "BK": bk}, num_warps=w, num_stages=st)
                for bm, bk, w, st in [(64, 64, 4, 3), (32, 64, 4, 3), (64, 128, 4, 2), (32, 128, 4, 2)]]

    @triton.jit
    def _fwd_kernel(x_ptr, a_ptr, hp_ptr, seed_ptr, M, K, R, KG, thr, scale, KSPLITS,
                    BR: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
        """Program (row block, column split): its split's share of h = (x * keep * scale) @ A.T, in float32."""
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        split = tl.program_id(1)
        rr = tl.arange(0, BR)
        seed = tl.load(seed_ptr)
        acc = tl.zeros((BM, BR), dtype=tl.float32)
        per = tl.cdiv(tl.cdiv(K, KSPLITS), BK) * BK
        for k0 in range(split * per, tl.minimum(split * per + per, K), BK):
            cols = k0 + tl.arange(0, BK)
            x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=(rows[:, None] < M) & (cols[None, :] < K),
                        other=0.0)
            x = tl.where(_keep(seed, rows, k0, KG, thr, BM, BK), x, tl.zeros_like(x))
            a = tl.load(a_ptr + rr[None, :] * K + cols[:, None], mask=(rr[None, :] < R) & (cols[:, None] < K),
                        other=0.0)
            if IEEE:
                acc = tl.dot(x, a, acc, input_precision="ieee")
            else:
                acc = tl.dot(x, a, acc)
        tl.store(hp_ptr + split * M * BR + rows[:, None] * BR + rr[None, :], acc * scale, mask=rows[:, None] < M)

    def _bwd_configs():
        return [triton.Config({"BM": bm, "BK": bk}, num_warps=w, num_stages=st)
                for bm, bk, w, st in [(64, 64, 4, 3), (128, 64, 8, 3), (64, 128, 4, 2), (32, 64, 4, 3)]]

    @triton.jit
    def _bwd_kernel(x_ptr, a_ptr, gh_ptr, dx_ptr, dap_ptr, seed_ptr, M, K, R, KG, thr, scale, SPLITS,
                    BR: tl.constexpr, IEEE: tl.constexpr, NEED_DX: tl.constexpr, BM: tl.constexpr,
                    BK: tl.constexpr):
        """Program (column block, row split): dx of its tile rows and its split's share of dA."""
        k0 = tl.program_id(0) * BK
        split = tl.program_id(1)
        cols = k0 + tl.arange(0, BK)
        rr = tl.arange(0, BR)
        seed = tl.load(seed_ptr)
        a = tl.load(a_ptr + rr[:, None] * K + cols[None, :], mask=(rr[:, None] < R) & (cols[None, :] < K), other=0.0)
        acc = tl.zeros((BR, BK), dtype=tl.float32)
        per = tl.cdiv(tl.cdiv(M, SPLITS), BM) * BM
        for m0 in range(split * per, tl.minimum(split * per + per, M), BM):
            rows = m0 + tl.arange(0, BM)
            in_rows = rows[:, None] < M
            gh = tl.load(gh_ptr + rows[:, None] * R + rr[None, :], mask=in_rows & (rr[None, :] < R), other=0.0)
            keep = _keep(seed, rows, k0, KG, thr, BM, BK)
            x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=in_rows & (cols[None, :] < K), other=0.0)
            x = tl.where(keep, x, tl.zeros_like(x))
            if IEEE:
                acc = tl.dot(tl.trans(gh), x, acc, input_precision="ieee")
            else:
                acc = tl.dot(tl.trans(gh), x, acc)
            if NEED_DX:
                if IEEE:
                    dx = tl.dot(gh, a, input_precision="ieee")
                else:
                    dx = tl.dot(gh, a)
                dx = tl.where(keep, dx * scale, tl.zeros_like(dx))
                tl.store(dx_ptr + rows[:, None] * K + cols[None, :], dx.to(dx_ptr.dtype.element_ty),
                         mask=in_rows & (cols[None, :] < K))
        tl.store(dap_ptr + split * BR * K + rr[:, None] * K + cols[None, :], acc * scale,
                 mask=(rr[:, None] < R) & (cols[None, :] < K))


_launchers: dict = {}


def _launcher(name: str):
    """The kernel behind an autotuner on a GPU; in Triton's CPU interpreter (TRITON_INTERPRET=1, the tests),
    which has no benchmarker, the kernel itself with the first configuration's blocks."""
    if name not in _launchers:
        kernel, configs, key = {"fwd": (_fwd_kernel, _fwd_configs(), ["K", "BR"]),
                                "bwd": (_bwd_kernel, _bwd_configs(), ["K", "BR", "NEED_DX"])}[name]
        if os.environ.get("TRITON_INTERPRET") == "1":
            first = configs[0].kwargs

            def run(grid, *args, _k=kernel, _b=first, **kw):
                g = grid(_b) if callable(grid) else grid
                return _k[g](*args, **kw, **_b)

            _launchers[name] = run
        else:
            tuned = _tuned[name] = triton.autotune(configs=configs, key=key)(kernel)
            _launchers[name] = lambda grid, *args, **kw: tuned[grid](*args, **kw)
    return _launchers[name]


_tuned: dict = {}


def chosen_configs() -> dict[str, str]:
    """The autotuner's choice for the last shapes each kernel ran, for the benchmark's record."""
    return {name: str(t.best_config) for name, t in _tuned.items() if getattr(t, "best_config", None) is not None}


def _block_r(r: int) -> int:
    return max(16, triton.next_power_of_2(r))


def _check(x: torch.Tensor, a: torch.Tensor) -> None:
    if x.dim() != 2 or a.dim() != 2 or x.shape[1] != a.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and A {tuple(a.shape)} are not (M, K) and (R, K)")
    if x.dtype != a.dtype:
        raise ValueError(f"x is {x.dtype} and A is {a.dtype}; cast A to x's dtype first")
    if x.shape[0] * triton.cdiv(x.shape[1], LANES) >= 2**31:
        raise ValueError(f"x {tuple(x.shape)} has too many elements for 32-bit mask counters")


def mask(shape: tuple[int, int], seed: torch.Tensor, p: float) -> torch.Tensor:
    """The keep mask (int8, 1 = kept) the kernels use for an (M, K) input with this seed and p."""
    m, k = shape
    thr, _ = threshold(p)
    out = torch.empty(m, k, dtype=torch.int8, device=seed.device)
    grid = (triton.cdiv(m, 32), triton.cdiv(k, 64))
    _mask_kernel[grid](out, seed, m, k, triton.cdiv(k, LANES), thr, BM=32, BK=64)
    return out


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _splits(blocks: int, most: int, device: torch.device) -> int:
    """How many ways to split the other dimension so that blocks x splits fills the GPU about 8 times over:
    one program a tile would leave most SMs a single CTA, and these kernels hide their latency with many."""
    return max(1, min(triton.cdiv(8 * _sms(device), blocks), most))


# Nominal blocks for the split counts: the buffers of partial sums are sized before the autotuner picks a
# configuration, so the counts cannot depend on its choice (each kernel rounds its share up to its own block).
_NOMINAL_BM, _NOMINAL_BK = 64, 64


def _fwd(x: torch.Tensor, a: torch.Tensor, seed: torch.Tensor, p: float) -> torch.Tensor:
    _check(x, a)
    m, k = x.shape
    r = a.shape[0]
    thr, scale = threshold(p)
    br = _block_r(r)
    ksplits = _splits(triton.cdiv(m, _NOMINAL_BM), triton.cdiv(k, _NOMINAL_BK), x.device)
    hp = torch.empty(ksplits, m, br, dtype=torch.float32, device=x.device)
    _launcher("fwd")(lambda meta: (triton.cdiv(m, meta["BM"]), ksplits),
                     x, a, hp, seed, m, k, r, triton.cdiv(k, LANES), thr, scale, ksplits, BR=br,
                     IEEE=x.dtype == torch.float32)
    return hp.sum(0)[:, :r].to(x.dtype)


def _bwd(gh: torch.Tensor, x: torch.Tensor, a: torch.Tensor, seed: torch.Tensor, p: float,
         need_dx: bool) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, a)
    m, k = x.shape
    r = a.shape[0]
    thr, scale = threshold(p)
    dx = torch.empty_like(x) if need_dx else x.new_empty(0)
    splits = _splits(triton.cdiv(k, _NOMINAL_BK), triton.cdiv(m, _NOMINAL_BM), x.device)
    br = _block_r(r)
    dap = torch.empty(splits, br, k, dtype=torch.float32, device=x.device)
    _launcher("bwd")(lambda meta: (triton.cdiv(k, meta["BK"]), splits),
                     x, a, gh, dx, dap, seed, m, k, r, triton.cdiv(k, LANES), thr, scale, splits, BR=br,
                     IEEE=x.dtype == torch.float32, NEED_DX=need_dx)
    return dx, dap.sum(0)[:r]


@torch.library.custom_op("qwen_train::lora_dropout_a", mutates_args=())
def lora_dropout_a(x: torch.Tensor, a: torch.Tensor, seed: torch.Tensor, p: float) -> torch.Tensor:
    """(x * keep / (1 - p)) @ a.T for x (M, K) and a (R, K) of x's dtype; seed: a one-element int64 tensor."""
    return _fwd(x, a, seed, p)


@lora_dropout_a.register_fake
def _(x, a, seed, p):
    return x.new_empty((x.shape[0], a.shape[0]))


@torch.library.custom_op("qwen_train::lora_dropout_a_backward", mutates_args=())
def lora_dropout_a_backward(gh: torch.Tensor, x: torch.Tensor, a: torch.Tensor, seed: torch.Tensor, p: float,
                            need_dx: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dA in float32) of lora_dropout_a; dx is empty when need_dx is False."""
    return _bwd(gh.contiguous(), x, a, seed, p, need_dx)


@lora_dropout_a_backward.register_fake
def _(gh, x, a, seed, p, need_dx):
    return (x.new_empty(x.shape) if need_dx else x.new_empty(0)), a.new_empty(a.shape, dtype=torch.float32)


def _setup(ctx, inputs, output):
    x, a, seed, p = inputs
    ctx.save_for_backward(x, a, seed)
    ctx.p = p


def _backward(ctx, gh):
    x, a, seed = ctx.saved_tensors
    need_dx = ctx.needs_input_grad[0]
    dx, da = lora_dropout_a_backward(gh, x, a, seed, ctx.p, need_dx)
    return (dx if need_dx else None), (da.to(a.dtype) if ctx.needs_input_grad[1] else None), None, None


lora_dropout_a.register_autograd(_backward, setup_context=_setup)


class DropoutLoraA(nn.Linear):
    """A peft adapter's lora_A with the adapter's dropout in front of it fused in (same weight Parameter, same
    state-dict name). Outside training, with p = 0 or off CUDA it is dropout + linear, as peft's modules are."""

    def __init__(self, linear: nn.Linear, p: float):
        super().__init__(linear.in_features, linear.out_features, bias=False, device="meta")
        self.weight = linear.weight
        self.p = float(p)
        threshold(self.p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.p > 0 and x.is_cuda):
            return F.linear(F.dropout(x, self.p, self.training), self.weight)
        # The matmul runs in autocast's dtype, as peft's F.linear would; A's gradient flows back through the cast.
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else x.dtype
        lead = x.shape[:-1]
        with torch.autocast("cuda", enabled=False):
            seed = torch.randint(0, 2**62, (1,), device=x.device, dtype=torch.int64)
            h = lora_dropout_a(x.reshape(-1, x.shape[-1]).to(dtype).contiguous(), self.weight.to(dtype), seed,
                               self.p)
        return h.view(*lead, h.shape[-1])

    def extra_repr(self) -> str:
        return super().extra_repr() + f", fused dropout p={self.p}"


def fuse_lora_dropout(model) -> int:
    """Replaces every peft LoRA layer's (dropout, lora_A) pair with DropoutLoraA; returns how many. Layers whose
    dropout is not a plain nn.Dropout (p = 0 gives an Identity) keep peft's modules."""
    n = 0
    for m in model.modules():
        if not (hasattr(m, "lora_A") and hasattr(m, "lora_dropout")) or type(m).__name__ == "ParamWrapper":
            continue  # peft's LoRA on 3-D expert weights (training.model.moe) builds its delta from lora_A's weight
        for name, drop in list(m.lora_dropout.items()):
            lin = m.lora_A[name] if name in m.lora_A else None
            if type(drop) is not nn.Dropout or type(lin) is not nn.Linear or drop.p <= 0:
                continue
            m.lora_A[name] = DropoutLoraA(lin, drop.p)
            m.lora_dropout[name] = nn.Identity()
            n += 1
    return n
