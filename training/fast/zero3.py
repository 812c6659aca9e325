"""The fast path under DeepSpeed ZeRO-3, which partitions every weight and gathers it in hooks around the forward
and backward of the module that owns it.

- Each decoder layer is one ZeRO-3 leaf module: its weights (LoRA adapters included) are gathered together in
  one collective before the layer runs, rather than one per projection, and the modules inside the layer carry
  no hooks, so the layer's forward compiles as one graph (training.fast.compile, forward_only).
- The LM head and the loss run in FastLoss.head_loss, outside the head module's own forward: the head's weight
  is registered as that module's external parameter, so it is gathered there (and for its backward) and its
  gradient is reduced and partitioned like any other.

Both must be set before deepspeed.initialize, which registers the hooks.
"""

from __future__ import annotations

from training.fast.compile import decoder_of


def prepare(model, loss_module=None) -> int:
    """Marks the decoder layers of `model` as ZeRO-3 leaf modules and, with our loss, registers the LM head's weight
    with it; returns how many layers."""
    from deepspeed.utils import set_z3_leaf_modules

    layers = decoder_of(model).layers
    set_z3_leaf_modules(model, [type(layers[0])])
    if loss_module is not None:
        loss_module.shard_head_weight()
    return len(layers)
