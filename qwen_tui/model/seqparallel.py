"""What sequence parallelism needs of the world and the model's heads (pure; no torch). The preset checks it
when it loads (for models whose shape is known without reading a file), the advice for local checkpoints.

Sequence parallelism (`training.sequence_parallel_size`, the worker's DeepSpeed Ulysses attention) spreads each
packed row over a group of GPUs: each holds 1/size of the row's tokens and attends over the whole row for
heads/size of the attention heads, so the size must divide the world, the query heads, and the key/value heads
(or be divisible by them: the KV heads are then copied).
"""

from __future__ import annotations

from .spec import TINY, ModelSpec, _from_shape, known_spec


def heads_problem(size: int, heads: int, kv_heads: int) -> str | None:
    """Why Ulysses cannot split these heads over `size` ranks, or None (training.sequence_parallel.shape_unfit)."""
    if size <= 1:
        return None
    if heads % size:
        return f"the model's {heads} attention heads do not divide among {size} ranks"
    if kv_heads % size and size % kv_heads:
        return f"the model's {kv_heads} key/value heads and {size} ranks: one must divide the other"
    return None


def fitting_sizes(world: int, heads: int, kv_heads: int) -> list[int]:
    """The sequence-parallel sizes > 1 that fit the world and the heads, smallest first."""
    return [s for s in range(2, world + 1) if world % s == 0 and heads_problem(s, heads, kv_heads) is None]


def spec_without_reading(model: str) -> ModelSpec | None:
    """The model's spec where it is known without reading a file (builtin:tiny, a known Qwen hub id)."""
    if model == "builtin:tiny":
        return _from_shape(model, TINY)
    return known_spec(model) if not model.startswith(("/", ".", "~")) else None


def sequence_parallel_problem(size: int, world: int, model: str, spec: ModelSpec | None = None) -> str | None:
    """Why `size` cannot run on `world` GPUs with `model`, or None. The heads are checked where the model's shape
    is known (spec, or spec_without_reading); a local checkpoint is checked by the advice and by the worker."""
    if size <= 1:
        return None
    if world % size:
        return f"{size} does not divide the {world} GPU(s): every GPU must be in one group of {size}"
    spec = spec or spec_without_reading(model)
    if spec is None:
        return None
    problem = heads_problem(size, spec.heads, spec.kv_heads)
    if problem:
        sizes = fitting_sizes(world, spec.heads, spec.kv_heads)
        return f"{problem} (sizes that fit {world} GPU(s): {', '.join(map(str, sizes)) if sizes else 'none but 1'})"
    return None
