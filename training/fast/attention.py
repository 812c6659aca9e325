"""Attention for packed rows: no token attends across a record boundary.

Registered with transformers' AttentionInterface as "packed_varlen" (and a mask function that
builds no mask: the boundaries come as `packed_cu_seq_lens`, which the decoder passes through
to every attention call). On CUDA it calls one of two varlen kernels (set_kernel, the worker's
--attention_kernel): PyTorch's flash kernel (torch.nn.attention.varlen.varlen_attn, FlashAttention 2)
or cuDNN's fused attention through the cudnn-frontend package (torch.ops.cudnn.sdpa_fwd, whose
autograd runs cuDNN's backward). Elsewhere, or where neither is there, it runs causal SDPA record
by record, which is exact and fine for the tiny CPU model.
Without `packed_cu_seq_lens` (an evaluation batch, say) it is plain causal SDPA.

kernel_inputs() turns a row's boundaries into what the kernel is given:
- flash: the boundaries as they are and the constant bound model_max_length. (The row's own longest
  record as the bound measures the same: bench/attention_kernels.py.)
- cudnn: the same bound, and the record count rounded up to a power of two (at least 16) with empty
  records: cuDNN builds an execution plan (forward and backward) for every (records, bound) pair it
  meets, which stalls the steps that meet a new count, so both are kept to a few values, and
  warm_cudnn() builds the plans of every count a row can need before the first step (7B: 6 counts
  in 0.8 s).
- cudnn, the row width: the frontend (1.32) also keys its backward plans on the row's token total
  rounded to 64, which sizes the plan's dQ accumulator. Rows are as wide as their records rounded up
  to 128, so nearly every new width built a backward plan mid-step, and its plan cache (128 entries,
  first in first out) turned over. bound_cudnn_totals() sizes every backward plan for the widest row
  the run can have: one plan per record count then serves every width, and warm_cudnn builds it.
  With that bound cuDNN is the worker's automatic choice where it can run (cudnn_unfit; training.fast.choice.decide),
  for heads it takes (cudnn_shape_unfit) and once it has matched FlashAttention 2 on a small row
  (cudnn_self_test); otherwise flash, with the reason in the fast-path summary.
"""

from __future__ import annotations

import inspect
import logging

import torch
import torch.nn.functional as F

NAME = "packed_varlen"
log = logging.getLogger("training")

try:  # torch >= 2.9
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn

    _VARLEN_PARAMS = set(inspect.signature(_varlen_attn).parameters)
except ImportError:  # older torch: the per-record path is used
    _varlen_attn = None
    _VARLEN_PARAMS = set()


KERNELS = ("flash", "cudnn")
_kernel = "flash"
CUDNN_MIN_RECORDS = 16  # the smallest record count cuDNN is given


def varlen_available() -> bool:
    return _varlen_attn is not None and torch.cuda.is_available()


def cudnn_available() -> bool:
    """cuDNN's varlen attention: the cudnn-frontend package (`import cudnn`) on a CUDA device of compute
    capability 9.0 or newer (Hopper), where its fused kernels run."""
    return _cudnn_missing() is None


def _cudnn_missing() -> str | None:
    """What this machine lacks for cuDNN's varlen attention, or None."""
    import importlib.util

    if not torch.cuda.is_available():
        return "no CUDA"
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        return f"cuDNN's fused varlen attention needs a Hopper or newer GPU (this one is sm_{major}{minor})"
    if importlib.util.find_spec("cudnn") is None:
        return "no nvidia-cudnn-frontend installed"
    return None


def cudnn_unfit() -> str | None:
    """Why cuDNN's attention is not the automatic choice on this machine, or None where it is: it needs
    cudnn_available() and a frontend whose backward plans bound_cudnn_totals can size for the widest row
    (without that, plans are built per row width mid-step and cuDNN measured no faster than flash)."""
    missing = _cudnn_missing()
    if missing:
        return missing
    try:
        from cudnn.sdpa.fwd import torch_op
    except ImportError as e:
        return f"nvidia-cudnn-frontend does not import ({e})"
    if _frontend_rounding(torch_op) is None:
        return "this nvidia-cudnn-frontend's backward plans cannot be sized for the widest row"
    return None


def cudnn_shape_unfit(head_dim: int) -> str | None:
    """Why cuDNN's fused attention cannot take this model's heads, or None where it can: cuDNN wants a head
    dimension that is a multiple of 8, and the worker keeps to at most 128 (every Qwen2/2.5/3 model has 64 or
    128; the larger sizes cuDNN allows on Hopper were never measured here)."""
    if head_dim % 8 or head_dim > 128:
        return f"cuDNN's fused attention takes head dimensions of up to 128 in steps of 8, not {head_dim}"
    return None


def cudnn_self_test(heads_q: int, heads_kv: int, head_dim: int, dtype, device, bound: int,
                    flash=None, cudnn=None) -> str | None:
    """Why cuDNN's attention must not be the automatic choice after all, or None: runs it and FlashAttention 2 on
    one small packed row (four records, forward and backward) and compares outputs and gradients. A frontend
    that does not load against this torch's cuDNN, or computes something else, then costs a warning and flash,
    not the run. `flash`/`cudnn` stand in for the kernels in tests."""
    flash = flash or _flash_varlen
    scale = head_dim ** -0.5
    lens = [5, 17, 42, 64]  # 128 tokens, as wide as a packed row is rounded to; the last as its padding tail
    bound = max(bound, max(lens))
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device=device)
    padded = _bucketed(cu)
    g = torch.Generator(device="cpu").manual_seed(0)
    shapes = [(sum(lens), heads_q, head_dim), (sum(lens), heads_kv, head_dim), (sum(lens), heads_kv, head_dim)]
    inputs = [torch.randn(sh, generator=g).to(device=device, dtype=dtype) for sh in shapes]
    dout = torch.randn(shapes[0], generator=g).to(device=device, dtype=dtype)
    results = []
    try:
        if cudnn is None:
            set_kernel("cudnn")  # registers the frontend's ops; an ImportError here is a finding too
            cudnn = _cudnn_varlen
        for fn, boundaries in ((flash, cu), (cudnn, padded)):
            q, k, v = (t.clone().requires_grad_(True) for t in inputs)
            out = fn(q, k, v, boundaries, bound, scale)
            out.backward(dout)
            results.append([out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()])
    except Exception as e:  # whatever the frontend raises (its own error classes too) rules it out: said, not hidden
        first = (str(e).splitlines() or [""])[0][:200]
        return f"cuDNN's attention failed its self-test ({type(e).__name__}: {first})"
    finally:
        set_kernel("flash")  # the caller sets the kernel it settles on
    for name, ref, got in zip(("output", "dq", "dk", "dv"), *results):
        err = (got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
        if not err <= 0.05:  # bf16 rounding is ~1e-2 of the largest value at most; NaN fails too
            return f"cuDNN's attention disagrees with FlashAttention 2 in its self-test ({name}: {err:.2g} relative)"
    return None


def set_kernel(name: str) -> None:
    """Which varlen kernel packed rows use on CUDA: "flash" or "cudnn". Call before compiling the layers."""
    global _kernel
    if name not in KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; one of {', '.join(KERNELS)}")
    if name == "cudnn":
        import cudnn.sdpa.fwd.torch_op  # noqa: F401  registers torch.ops.cudnn.sdpa_fwd / sdpa_bwd
    _kernel = name


def kernel_inputs(cu_seq_lens: torch.Tensor, longest: int, bound: int) -> tuple[torch.Tensor, int]:
    """(boundaries, length bound) handed to the attention for a packed row whose longest segment is
    `longest` tokens, with `bound` (model_max_length) the most any row may have (see the module doc)."""
    if longest > bound:
        raise ValueError(f"a segment of {longest} tokens is longer than the bound {bound}")
    return (_bucketed(cu_seq_lens) if _kernel == "cudnn" else cu_seq_lens), int(bound)


def _bucketed(cu_seq_lens: torch.Tensor) -> torch.Tensor:
    """The boundaries with empty records added up to record_bucket's count (what cuDNN is given)."""
    n = cu_seq_lens.numel() - 1
    extra = record_bucket(n) - n
    return torch.cat([cu_seq_lens, cu_seq_lens[-1:].expand(extra)]) if extra else cu_seq_lens


def record_bucket(n: int) -> int:
    """The record count a row of n records (and padding segments) is given to cuDNN with."""
    b = CUDNN_MIN_RECORDS
    while b < n:
        b *= 2
    return b


def _flash_varlen(q, k, v, cu, max_len: int, scale: float):
    """q: (T, Hq, D), k/v: (T, Hkv, D) -> (T, Hq, D)."""
    kw = {"scale": scale}
    if "window_size" in _VARLEN_PARAMS:
        kw["window_size"] = (-1, 0)  # causal
    else:
        kw["is_causal"] = True
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in _VARLEN_PARAMS:
            kw["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return _varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)


def warm_cudnn(heads_q: int, heads_kv: int, head_dim: int, dtype, device, bound: int, max_records: int,
               scale: float | None = None) -> tuple[int, float]:
    """Builds cuDNN's forward and backward plans for every record-count bucket up to `max_records`
    (a row can hold no more records than its tokens over the shortest record's). Returns (buckets,
    seconds)."""
    import time

    t0, n = time.perf_counter(), 0
    scale = head_dim ** -0.5 if scale is None else scale
    b = CUDNN_MIN_RECORDS
    while True:
        # One token a record: the plans depend on the record count, the bound and the layout, not the tokens.
        q = torch.zeros(b, heads_q, head_dim, dtype=dtype, device=device, requires_grad=True)
        k = torch.zeros(b, heads_kv, head_dim, dtype=dtype, device=device, requires_grad=True)
        v = torch.zeros(b, heads_kv, head_dim, dtype=dtype, device=device, requires_grad=True)
        cu = torch.arange(b + 1, dtype=torch.int32, device=device)
        _cudnn_varlen(q, k, v, cu, bound, scale).sum().backward()
        n += 1
        if b >= max_records:
            break
        b *= 2
    torch.cuda.synchronize(device)
    return n, time.perf_counter() - t0


def bound_cudnn_totals(tokens: int, torch_op=None) -> bool:
    """Sizes cudnn-frontend's backward plans for rows of up to `tokens` tokens, whatever the row's own width
    (see the module doc). A plan built for more tokens serves fewer: the frontend's own rule only forbids
    the reverse. Returns False, changing nothing, when the frontend lacks the hook this relies on (its
    64-token rounding of the totals); the plans are then built per width, as before."""
    if torch_op is None:
        from cudnn.sdpa.fwd import torch_op
    base = _frontend_rounding(torch_op)
    if base is None:
        log.warning("cuDNN attention: this cudnn-frontend has no 64-token rounding of token totals to bound; "
                    "backward plans stay per row width")
        return False
    cap = base(int(tokens))

    def rounded(n: int) -> int:
        m = base(n)
        return cap if m <= cap else m

    rounded.__wrapped__ = base
    torch_op._round64 = rounded
    return True


def _frontend_rounding(torch_op):
    """cudnn-frontend's own rounding of a row's token total (to 64), under any bound we set on it, or None
    where the frontend has none or rounds otherwise (a version this was not measured with)."""
    current = getattr(torch_op, "_round64", None)
    if current is None:
        return None
    base = getattr(current, "__wrapped__", current)  # bound before: the frontend's own rounding underneath
    try:
        ok = base(1) == 64 and base(65) == 128 and base(128) == 128
    except TypeError as e:  # a changed signature: not the hook we know
        log.debug("cudnn-frontend _round64 is not the rounding we bound: %s", e)
        return None
    return base if ok else None


def _cudnn_varlen(q, k, v, cu, max_len: int, scale: float):
    """q: (T, Hq, D), k/v: (T, Hkv, D) -> (T, Hq, D); GQA is native to cuDNN."""
    out, _lse = torch.ops.cudnn.sdpa_fwd(q, k, v, scale, is_causal=True, cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                         max_seqlen_q=max_len, max_seqlen_kv=max_len, return_lse=True)
    return out


def _per_record_sdpa(q, k, v, cu, scale: float):
    """q: (1, Hq, T, D) -> (1, Hq, T, D), causal within each segment of cu."""
    out = torch.empty_like(q)
    bounds = cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        out[:, :, a:b] = F.scaled_dot_product_attention(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], is_causal=True, scale=scale,
            enable_gqa=q.shape[1] != k.shape[1])
    return out


def packed_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                             packed_cu_seq_lens=None, packed_max_length=None, **kwargs):
    """transformers attention signature: query (B, Hq, T, D), key/value (B, Hkv, T, D) -> ((B, T, Hq, D), None)."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if packed_cu_seq_lens is None:
        gqa = query.shape[1] != key.shape[1]
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale, enable_gqa=gqa)
        return out.transpose(1, 2).contiguous(), None
    if query.shape[0] != 1:
        raise ValueError(f"a packed batch is one row, got batch size {query.shape[0]}")
    if query.is_cuda and _varlen_attn is not None:
        if query.dtype not in (torch.float16, torch.bfloat16):
            # fp32 master weights under autocast: RoPE's fp32 cos/sin promote q and k; flash wants 16-bit,
            # as SDPA would get under autocast.
            dt = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else torch.bfloat16
            query, key, value = query.to(dt), key.to(dt), value.to(dt)
        q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, H, D)
        varlen = _cudnn_varlen if _kernel == "cudnn" else _flash_varlen
        out = varlen(q, k, v, packed_cu_seq_lens, packed_max_length, scale)
        return out.unsqueeze(0), None
    out = _per_record_sdpa(query, key, value, packed_cu_seq_lens, scale)
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    return None  # boundaries travel as packed_cu_seq_lens; causality is the kernel's


def register() -> str:
    """Registers the attention and its (empty) mask function with transformers; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, packed_attention_forward)
    AttentionMaskInterface.register(NAME, _no_mask)
    return NAME


def use_packed_attention(model) -> None:
    """Switches a loaded transformers model (or a peft wrapper of one) to the packed attention."""
    register()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "set_attn_implementation"):
        base.set_attn_implementation(NAME)
    else:
        base.config._attn_implementation = NAME
