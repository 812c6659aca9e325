"""The CUDA caching allocator: expandable segments (--expandable_segments) and its retry counter.

Packed rows change width from one micro-batch to the next, so the activations of each micro-batch
need blocks of sizes the allocator has not cached. Near the memory limit (the memory probe plans
for ~90% of the GPU) the default allocator then finds no cached block large enough, frees its
whole cache and tries again: `cudaFree` waits for the device, so every retry is a GPU-wide
synchronisation in the middle of a step. Expandable segments grow one mapped range per stream
instead of carving fixed segments, which leaves nothing to free and retry.

The setting has to be in PYTORCH_CUDA_ALLOC_CONF before torch starts CUDA, so configure() runs in
the worker's entry point, before torch is imported; it never overrides what the user set there.
"""

from __future__ import annotations

import os

from training.runtime.errors import InputError

ENV = "PYTORCH_CUDA_ALLOC_CONF"
KEY = "expandable_segments"


def _setting(conf: str) -> bool | None:
    """expandable_segments in an allocator config string: True, False, or None when it is not there."""
    for part in conf.split(","):
        key, _, value = part.partition(":")
        if key.strip() == KEY:
            return value.strip().lower() == "true"
    return None


def configure(choice: bool | None, environ=os.environ) -> tuple[bool, str]:
    """Puts expandable segments into PYTORCH_CUDA_ALLOC_CONF as `choice` says (None: on unless the variable
    already decides). Returns (on, why). A flag that contradicts the variable is an error: which one is meant?"""
    conf = environ.get(ENV, "")
    current = _setting(conf)
    if current is not None:
        if choice is not None and choice != current:
            flag = "--expandable_segments" if choice else "--no_expandable_segments"
            raise InputError(f"{flag} contradicts {ENV}={conf!r}; drop one of them")
        return current, f"as set by {ENV}"
    if choice is False:
        return False, "off as given"
    environ[ENV] = f"{conf},{KEY}:True" if conf.strip() else f"{KEY}:True"
    return True, ("as given" if choice else
                  "on: packed rows change width, and the default segments make the allocator free and retry near "
                  "the memory limit")


def retries(device) -> int:
    """How many times the caching allocator freed its cache to retry an allocation since the process started."""
    import torch

    if device.type != "cuda":
        return 0
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))
