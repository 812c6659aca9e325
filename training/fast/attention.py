"""Attention for packed rows: no token attends across a record boundary.

Registered with transformers' AttentionInterface as "packed_varlen" (and a mask function that
builds no mask: the boundaries come as `packed_cu_seq_lens`, which the decoder passes through
to every attention call). On CUDA it calls PyTorch's flash varlen kernel
(torch.nn.attention.varlen.varlen_attn); elsewhere, or where that kernel is missing, it runs
causal SDPA record by record, which is exact and fine for the tiny CPU model.
Without `packed_cu_seq_lens` (an evaluation batch, say) it is plain causal SDPA.
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


def varlen_available() -> bool:
    return _varlen_attn is not None and torch.cuda.is_available()


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
        out = _flash_varlen(q, k, v, packed_cu_seq_lens, int(packed_max_length), scale)
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
