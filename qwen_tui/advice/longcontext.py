"""The advice rules about long records and sequence parallelism (registered by qwen_tui.advice.rules).

A row of model_max_length tokens on the worker's long-row path (qwen_tui.plan.longcontext) must fit each GPU; where
it does not, the first of these that fits is offered: sequence parallelism over more GPUs (the smallest size
that fits), else a shorter model_max_length (the longest that fits; longer records are then cut).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..base.levels import Level
from ..plan.longcontext import (
    fitting_sizes,
    heads_problem,
    is_long,
    longest_record,
    row_memory,
    sequence_parallel_problem,
)
from .core import Advice, Context, Fix, _gb, rule


def _sp(c: Context) -> int:
    return c.t.sequence_parallel_size


@rule
def sequence_parallel_shape(c: Context) -> Iterable[Advice]:
    """The heads of a model the preset's validation could not see (a local checkpoint)."""
    if _sp(c) <= 1 or c.spec is None:
        return
    problem = sequence_parallel_problem(_sp(c), c.preset.world_size, c.t.model, spec=c.spec)
    if problem is None:
        return
    sizes = [s for s in fitting_sizes(c.preset.world_size, c.spec.heads, c.spec.kv_heads) if s <= _sp(c)]
    size = sizes[-1] if sizes else 1
    yield Advice(Level.ERROR, "SP_SHAPE", f"sequence_parallel_size {_sp(c)}: {problem}",
                 Fix(f"Sequence parallel size {size}", {"training.sequence_parallel_size": size}))


@rule
def sequence_parallel_packing(c: Context) -> Iterable[Advice]:
    if _sp(c) > 1 and "--no_packing" in c.t.extra_args:
        yield Advice(Level.ERROR, "SP_NEEDS_PACKING",
                     f"sequence_parallel_size {_sp(c)} shards packed rows, and extra_args turn packing off",
                     Fix("Drop --no_packing", {"training.extra_args": [a for a in c.t.extra_args
                                                                       if a != "--no_packing"]}))


def _long_fix(c: Context, limit: int) -> Fix | None:
    """Sequence parallelism that fits (smallest size), else the longest model_max_length that fits."""
    assert c.spec is not None and c.gpu_memory_gib is not None
    world, t = c.preset.world_size, c.t
    for size in fitting_sizes(world, c.spec.heads, c.spec.kv_heads):
        if size <= _sp(c):
            continue
        changes: dict[str, Any] = {"training.sequence_parallel_size": size}
        trial = t.model_copy(update={"sequence_parallel_size": size})
        if row_memory(c.spec, trial, world, t.model_max_length).total <= c.gpu_memory_gib:
            return Fix(f"Sequence parallel size {size}: {t.model_max_length // size:,} tokens a GPU", changes)
    if limit >= 1024:
        return Fix(f"model_max_length {limit:,} (longer records are cut)", {"training.model_max_length": limit})
    return None


@rule
def long_records(c: Context) -> Iterable[Advice]:
    """Rows of model_max_length tokens on the long-row path (the stock-path OOM rule steps aside for them)."""
    if c.spec is None or c.cpu or c.gpu_memory_gib is None or not is_long(c.t):
        return
    if heads_problem(_sp(c), c.spec.heads, c.spec.kv_heads):
        return  # SP_SHAPE speaks first
    gib, world, t = c.gpu_memory_gib, c.preset.world_size, c.t
    mem = row_memory(c.spec, t, world, t.model_max_length)
    limit = longest_record(c.spec, t, world, gib)
    how = (f"{'tiled MLP, ' if mem.tiled else ''}checkpointed layers, fused loss"
           + (f", {_sp(c)} GPUs a row" if _sp(c) > 1 else ""))
    if mem.total > gib:
        yield Advice(Level.ERROR, "LONG_RECORD_OOM",
                     f"a record of model_max_length {t.model_max_length:,} tokens needs ~{_gb(mem.total)} per GPU > "
                     f"{_gb(gib)} ({c.gpu_memory_where}); the longest that fits is {limit:,} tokens ({how})",
                     _long_fix(c, limit))
    else:
        yield Advice(Level.INFO, "LONG_CONTEXT",
                     f"records of up to {limit:,} tokens fit each GPU ({c.gpu_memory_where}: {how}); "
                     f"model_max_length {t.model_max_length:,} needs ~{_gb(mem.total)}")
