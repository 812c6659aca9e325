"""The fast path under DeepSpeed ZeRO-3, which partitions every weight and gathers it in hooks around the forward
and backward of the module that owns it.

- Each decoder layer is one ZeRO-3 leaf module: its weights (LoRA adapters included) are gathered together in
  one collective before the layer runs, rather than one per projection, and the modules inside the layer carry
  no hooks, so the layer's forward compiles as one graph (training.fast.compile, forward_only).
- A mixture-of-experts block is a leaf module as well (training.model.moe): its router sends each rank's tokens to
  different experts, and hooks per expert would gather different weights on different ranks.
- The LM head and the loss run in FastLoss.head_loss, outside the head module's own forward: the head's weight
  is registered as that module's external parameter, so it is gathered there (and for its backward) and its
  gradient is reduced and partitioned like any other.

Both must be set before deepspeed.initialize, which registers the hooks.
"""

from __future__ import annotations

import logging

from training.fast.compile import decoder_of

log = logging.getLogger("training")


def prepare(model, loss_module=None) -> int:
    """Marks the decoder layers of `model` as ZeRO-3 leaf modules and, with our loss, registers the LM head's weight
    with it; returns how many layers."""
    from deepspeed.utils import set_z3_leaf_modules

    from training.model.moe import zero3_leaf_types

    layers = decoder_of(model).layers
    # A mixture-of-experts layer's sparse block is a leaf too (inside the layer's gather, and on its own wherever
    # the layer is not one): every expert's weights are gathered together, so ranks whose tokens chose different
    # experts run the same collectives and never wait on a gather another rank does not make.
    leaves = [type(layers[0]), *zero3_leaf_types(model)]
    set_z3_leaf_modules(model, leaves)
    log.info("ZeRO-3 leaf modules (each gathered whole): %s", ", ".join(t.__name__ for t in leaves))
    if loss_module is not None:
        loss_module.shard_head_weight()
    return len(layers)
