"""Which kernel runs a mixture-of-experts block's experts (--experts_implementation).

transformers 5 stores a block's experts fused as 3-D weights and dispatches their forward through
`config._experts_implementation` (`@use_experts_implementation`): "eager" loops over the experts with one small
matmul each, "grouped_mm" sorts the token-expert pairs by expert and runs each projection as one grouped matmul
(torch's grouped GEMM on CUDA), "batched_mm" copies every pair's expert weights (one 3-D weight per token: for
decoding, never for training rows). The worker picks, unless told:

    lean        on CUDA where torch has a grouped matmul: transformers' grouped_mm recast for training, below;
    eager       on the CPU and wherever the grouped matmul is missing (older torch, pre-Ampere GPUs): the
                reference loop, exact per-expert matmuls whatever the torch build.

"lean" is the grouped_mm forward with the same grouped matmuls and two changes that cut what the backward keeps
and moves (the block's expert weights frozen or not, the maths unchanged):
  - each pair's routing weight scales the expert's intermediate activation (width moe_intermediate_size) before
    the down projection instead of its output (hidden width) after it: the same product, and the backward no
    longer keeps the pairs' (pairs x hidden) outputs to differentiate the routing weights;
  - the token-to-pair gather and the pair-to-token scatter differentiate as gathers of a permutation and a sum
    over each token's top-k (no atomic adds of every pair's gradient into its token).
Expert-parallel, biased or post-normed experts fall back to grouped_mm.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("training")

LEAN = "lean"


class _PairGather(torch.autograd.Function):
    """x[src] with src = perm // k (each token once per pick, in expert order); backward: the pairs' gradients
    put back in token order (inv = perm's inverse) and summed over each token's k picks."""

    @staticmethod
    def forward(ctx, x, src, inv, k: int):
        ctx.save_for_backward(inv)
        ctx.k = k
        return x[src]

    @staticmethod
    def backward(ctx, grad):
        (inv,) = ctx.saved_tensors
        return grad[inv].view(-1, ctx.k, grad.shape[-1]).sum(dim=1), None, None, None


class _Permute(torch.autograd.Function):
    """x[idx] for a permutation idx; backward: grad[inv] (inv = idx's inverse), a gather as well."""

    @staticmethod
    def forward(ctx, x, idx, inv):
        ctx.save_for_backward(inv)
        return x[idx]

    @staticmethod
    def backward(ctx, grad):
        (inv,) = ctx.saved_tensors
        return grad[inv], None, None


def lean_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                         top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts' output (tokens, hidden) for the routers' picks (tokens, k) and weights (tokens, k)."""
    from transformers.integrations.moe import (
        _grouped_linear,
        grouped_mm_experts_forward,
    )

    if (getattr(self, "_is_expert_parallel", False) or getattr(self, "has_bias", False)
            or getattr(self, "has_post_expert_norm", False) or not getattr(self, "has_gate", True)):
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    tokens, hidden = hidden_states.shape
    k = top_k_index.size(-1)
    flat = top_k_index.reshape(-1)
    expert_of_pair, perm = torch.sort(flat)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    # histc, not bincount: no size read back to the host (CUDA graphs, compiled layers); CPU histc takes floats
    counts = torch.histc(expert_of_pair.float() if flat.device.type in ("cpu", "mps") else expert_of_pair.int(),
                         bins=self.num_experts, min=0, max=self.num_experts - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    x = _PairGather.apply(hidden_states, perm // k, inv, k)
    gate_up = _grouped_linear(x, self.gate_up_proj, offsets, is_transposed=self.is_transposed)
    inner = self._apply_gate(gate_up) * top_k_weights.reshape(-1)[perm].unsqueeze(-1).to(gate_up.dtype)
    out = _grouped_linear(inner, self.down_proj, offsets, is_transposed=self.is_transposed)
    out = _Permute.apply(out, inv, perm)  # back to (token, pick) order
    return out.view(tokens, k, hidden).sum(dim=1).to(hidden_states.dtype)


def register() -> bool:
    """Adds "lean" to transformers' experts implementations; False where this transformers has none."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        return False
    ALL_EXPERTS_FUNCTIONS.register(LEAN, lean_experts_forward)
    return True


def grouped_mm_unfit(device: torch.device) -> str | None:
    """Why torch's grouped matmul cannot run the experts on `device` (None: it can), as transformers decides."""
    if device.type != "cuda":
        return "CPU" if device.type == "cpu" else device.type
    if not (hasattr(torch.nn.functional, "grouped_mm") or hasattr(torch, "_grouped_mm")):
        return f"torch {torch.__version__} has no grouped matmul"
    major, minor = torch.cuda.get_device_capability(device)
    if not hasattr(torch.nn.functional, "grouped_mm") and tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 9):
        if major != 9:
            return f"torch {torch.__version__}'s grouped matmul needs a Hopper GPU (this one is sm{major}{minor})"
    elif (major, minor) < (8, 0):
        return f"the grouped matmul needs compute capability 8.0 or newer (this GPU is {major}.{minor})"
    return None


def choose(requested: str, device: torch.device, has_interface: bool) -> tuple[str, str]:
    """(implementation, why) for --experts_implementation `requested` on `device`."""
    if not has_interface:
        return "eager", "eager: this transformers has no experts implementations (one MLP module an expert)"
    if requested != "auto":
        return requested, "as given"
    unfit = grouped_mm_unfit(device)
    if unfit:
        return "eager", f"eager: {unfit} (the reference loop over experts; the grouped matmul is for CUDA)"
    return LEAN, ("lean: CUDA grouped matmul, one per projection for all experts (transformers' grouped_mm "
                  "with the routing weights on the intermediate and gather-only backward: less kept, less moved)")


def apply(model, requested: str, device: torch.device) -> tuple[str, str] | None:
    """Sets the experts implementation of a mixture-of-experts `model` (through a peft wrapper); returns
    (implementation, why), or None for a model without sparse blocks."""
    from training.model.moe import sparse_blocks

    if not sparse_blocks(model):
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    has = hasattr(base, "set_experts_implementation") and register()
    impl, why = choose(requested, device, has)
    if has:
        base.set_experts_implementation(impl)
        if base.config._experts_implementation != impl:
            raise RuntimeError(f"experts implementation {impl!r} asked, transformers set "
                               f"{base.config._experts_implementation!r}")
    elif requested not in ("auto", "eager"):
        from training.runtime.errors import InputError

        raise InputError(f"--experts_implementation {requested}: this transformers runs the experts as separate "
                         "MLP modules (no experts implementations); leave it to auto")
    return impl, why
