"""One micro-batch through the decoder and the loss, for a packed or a padded batch.

The decoder (not the CausalLM head) runs, so the full logits are never built unless
ce="plain"; the loss comes back as a sum over labelled tokens with their count, and the
caller divides by the labelled tokens of the whole optimizer step.
"""

from __future__ import annotations

import torch

from training.fast.compile import decoder_of, lm_head_of
from training.fast.loss import labelled_cross_entropy_sum, linear_cross_entropy_sum


def to_device(batch: dict, device) -> dict:
    return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def decoder_hidden(model, batch: dict, max_segment: int | None = None) -> torch.Tensor:
    """The decoder's last hidden states for a packed row (input_ids, position_ids, cu_seq_lens) or a padded batch
    (input_ids, attention_mask), in the autocast dtype where autocast is on (as the LM head's Linear would see it)."""
    decoder = decoder_of(model)
    if "cu_seq_lens" in batch:
        from training.fast.attention import kernel_inputs

        longest = int(batch["max_length"])
        cu, bound = kernel_inputs(batch["cu_seq_lens"], longest, max_segment if max_segment is not None else longest)
        out = decoder(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False,
                      packed_cu_seq_lens=cu, packed_max_length=bound)
    else:
        out = decoder(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), use_cache=False)
    hidden = out[0] if not hasattr(out, "last_hidden_state") else out.last_hidden_state
    dev = hidden.device.type
    if hidden.dtype == torch.float32 and torch.is_autocast_enabled(dev):
        hidden = hidden.to(torch.get_autocast_dtype(dev))  # the LM head matmul in the autocast dtype, as a Linear would
    return hidden


def head_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, batch: dict, ce: str, chunk_size: int = 4096,
                  labelled_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The LM head and the loss over `hidden`: (loss sum, labelled tokens). labelled_only: a packed row's head and
    loss run on its supervised positions only (the row's loss_positions); the sum and the count are the same."""
    if labelled_only and "loss_positions" in batch:
        return labelled_cross_entropy_sum(hidden, weight, batch["loss_positions"], batch["loss_targets"],
                                          impl=ce, chunk_size=chunk_size)
    return linear_cross_entropy_sum(hidden, weight, batch["labels"], impl=ce, chunk_size=chunk_size)


def micro_batch_loss_sum(model, batch: dict, ce: str, max_segment: int | None = None,
                         chunk_size: int = 4096, labelled_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """batch on the model's device: a packed row or a padded batch (see decoder_hidden). Returns (loss sum,
    labelled tokens); the caller divides by the labelled tokens of the whole optimizer step."""
    hidden = decoder_hidden(model, batch, max_segment)
    return head_loss_sum(hidden, lm_head_of(model).weight, batch, ce, chunk_size, labelled_only)
