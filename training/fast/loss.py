"""Causal-LM cross-entropy from the last hidden states, without building the full logits.

The full logits of a micro-batch are tokens x vocabulary (152k for Qwen2.5): at 16k tokens
that is 4.6 GiB in bf16 and twice that again for the float32 softmax and its gradient. Here
the loss and both gradients are computed chunk by chunk in the forward pass (the way Liger's
fused linear cross-entropy does it), so at most one chunk of logits exists at a time and no
logits are kept for backward.

impl="liger"    Liger-Kernel's fused Triton kernel (CUDA; needs the liger-kernel package), in chunks of
                at most LIGER_CHUNK_ROWS rows (Liger's own rule cuts a row into vocab / hidden chunks,
                43 of 256-512 rows on Qwen2.5-7B: the LM head's weight is then read from memory 43
                times a row, and a full fine-tune's weight gradient read and written as often)
impl="chunked"  the same algorithm in plain torch (any device)
impl="plain"    full logits, F.cross_entropy: the reference

labelled_cross_entropy_sum runs the LM head on the supervised positions only (packed rows know them on
the host). All return the SUM of token losses and the number of labelled tokens, so a caller can divide by
the labelled tokens of a whole optimizer step (the same normalisation for packed and padded
batches). Labels are shifted here: position t predicts labels[t + 1].
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from training.data.encoding import IGNORE_INDEX  # the label of a token the loss skips

IMPLS = ("liger", "chunked", "plain")
# Liger's chunks: 2,048 rows of bf16 logits are 0.6 GiB at Qwen's 152k vocabulary, and the two memory
# probes (rows of 2,048 and 4,096 tokens, training.fast.autobatch) both meet exactly that transient.
LIGER_CHUNK_ROWS = 2048


def liger_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("liger_kernel") is not None


def _upcast(t: torch.Tensor) -> torch.Tensor:
    """Softmax in at least float32 (16-bit logits are upcast; float64 stays float64)."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) labels -> (B, T) targets: targets[:, t] = labels[:, t + 1], the last one ignored."""
    pad = torch.full_like(labels[:, :1], IGNORE_INDEX)
    return torch.cat([labels[:, 1:], pad], dim=1)


class _ChunkedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, chunk: int):
        need_w = ctx.needs_input_grad[1]
        need_h = ctx.needs_input_grad[0]
        total = torch.zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = (torch.zeros(weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32), device=weight.device)
                  if need_w else None)
        for a in range(0, hidden.shape[0], chunk):
            h = hidden[a:a + chunk]
            y = target[a:a + chunk]
            valid = y != IGNORE_INDEX
            yi = torch.where(valid, y, torch.zeros_like(y))
            logits = _upcast(h @ weight.t())
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, yi.unsqueeze(1)).squeeze(1)
            total += torch.where(valid, lse - picked, torch.zeros_like(lse)).sum()
            if need_h or need_w:
                g = logits.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place of the logits
                g[torch.arange(g.shape[0], device=g.device), yi] -= 1.0
                g.mul_(valid.unsqueeze(1))
                g = g.to(hidden.dtype)
                if need_h:
                    grad_h[a:a + chunk] = g @ weight
                if need_w:
                    grad_w.add_(g.t() @ h)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        gh = grad_h * grad_out.to(grad_h.dtype) if grad_h is not None else None
        gw = (grad_w * grad_out).to(ctx.weight_dtype) if grad_w is not None else None
        return gh, gw, None, None


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                             impl: str = "chunked", chunk_size: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden (B, T, H) last hidden states, weight (V, H) the LM head, labels (B, T) unshifted.

    Returns (sum of token losses in float32, or float64 for float64 inputs; number of labelled tokens)."""
    target = shift_labels(labels).reshape(-1)
    n = (target != IGNORE_INDEX).sum()
    return targets_cross_entropy_sum(hidden.reshape(-1, hidden.shape[-1]), weight, target, impl, chunk_size), n


def targets_cross_entropy_sum(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, impl: str = "chunked",
                              chunk_size: int = 4096) -> torch.Tensor:
    """h (N, H) hidden states, target (N,) the token each should predict (or IGNORE_INDEX): the summed loss."""
    if impl not in IMPLS:
        raise ValueError(f"unknown cross-entropy implementation {impl!r}; known: {', '.join(IMPLS)}")
    w = weight if weight.dtype == h.dtype else weight.to(h.dtype)  # differentiable cast (fp32 master weights)
    if h.shape[0] == 0:
        # nothing to predict (a row of padding): a zero that still reaches the graph, so every rank runs backward
        return (h.sum() * 0.0 + w.view(-1)[0] * 0.0).float()
    if impl == "plain":
        logits = _upcast(h @ w.t())
        return F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum")
    if impl == "liger":
        return _liger_sum(h, w, target, LIGER_CHUNK_ROWS).float()
    return _ChunkedLinearCE.apply(h, w, target, chunk_size)


def liger_chunk_budget(rows: int, vocab: int, hidden: int, chunk_rows: int) -> int:
    """Liger's chunk_mem_const for chunks of at most `chunk_rows` rows (a power of two) out of `rows`. Liger
    cuts the rows into n = ceil(vocab / (budget x hidden)) chunks of next_pow2(ceil(rows / n)) rows; the
    budget here makes n the fewest pieces of chunk_rows (so a row of up to chunk_rows tokens is one chunk and
    one of twice that is two: both memory probes meet the same transient), or more pieces where no budget
    gives exactly that many."""
    pieces = max(1, -(-rows // chunk_rows))
    budget = -(-vocab // (pieces * hidden))
    if -(-vocab // (budget * hidden)) < pieces:  # ceilings: no budget cuts exactly `pieces`; cut more
        budget = max(1, vocab // (pieces * hidden))
    return budget


_LIGER_ARGS: list | None = None


def _liger_sum(h: torch.Tensor, w: torch.Tensor, target: torch.Tensor, chunk_rows: int) -> torch.Tensor:
    """Liger's fused linear cross-entropy (sum) in chunks of about chunk_rows rows. TRAINING_LIGER_CHUNK_ROWS
    overrides the rows (0: Liger's own chunking, for comparison); a Liger without chunk_mem_const gets its own."""
    global _LIGER_ARGS
    import inspect
    import os

    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction as Fn

    rows = int(os.environ.get("TRAINING_LIGER_CHUNK_ROWS", chunk_rows))
    if _LIGER_ARGS is None:
        _LIGER_ARGS = list(inspect.signature(Fn.forward).parameters.values())[1:]  # after ctx
    names = [p.name for p in _LIGER_ARGS]
    given = {"_input": h, "weight": w, "target": target, "ignore_index": IGNORE_INDEX, "reduction": "sum"}
    if rows > 0 and "chunk_mem_const" in names:
        given["chunk_mem_const"] = liger_chunk_budget(h.shape[0], w.shape[0], w.shape[1], rows)
    unfilled = [p.name for p in _LIGER_ARGS if p.name not in given and p.default is inspect.Parameter.empty]
    if unfilled or not {"_input", "weight", "target", "reduction"} <= set(names):
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss  # an unknown Liger: its module

        return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")(w, h, target)
    out = Fn.apply(*[given[p.name] if p.name in given else p.default for p in _LIGER_ARGS])
    return out[0] if isinstance(out, tuple) else out


def labelled_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor,
                               targets: torch.Tensor, impl: str = "chunked",
                               chunk_size: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """The same loss as linear_cross_entropy_sum, with the LM head run only where it counts: `positions`
    (flat indices into hidden's B*T rows, from training.fast.packing) are the tokens whose next label is
    supervised and `targets` those labels. A prompt's tokens need no logits at all, and the LM head is the
    model's widest matmul (152k outputs on Qwen2.5), so skipping them saves its share of every step in
    proportion to the unsupervised tokens. The count comes from the positions' shape: no device read."""
    h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
    n = torch.full((), positions.shape[0], dtype=torch.long, device=hidden.device)
    return targets_cross_entropy_sum(h, weight, targets, impl, chunk_size), n
