"""AdamW with the fused (single-kernel) implementation where the parameters' device has it."""

from __future__ import annotations

import torch


def fused_supported(params) -> bool:
    params = list(params)
    return bool(params) and all(p.device.type in ("cuda", "cpu") and p.is_floating_point() for p in params)


def make_adamw(param_groups, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, fused: bool = True):
    """param_groups: a list of dicts with 'params' (and 'weight_decay'). fused=False gives the default
    (foreach) implementation, the reference the fused one is checked against."""
    groups = [dict(g) for g in param_groups]
    everything = [p for g in groups for p in g["params"]]
    use_fused = fused and fused_supported(everything)
    kwargs = {"fused": True} if use_fused else {}
    opt = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **kwargs)
    opt.is_fused = use_fused
    return opt
