"""Long context: the longest record one GPU trains (pure; no torch). What sequence parallelism needs of the
world and the heads is qwen_tui.model.seqparallel's (a floor below: the preset checks it as it loads).

The longest record (`longest_record`) is that of the worker's long-row path, which the stock-path estimate
(qwen_tui.plan.estimate.estimate_memory: transformers' loss over full logits) does not describe: one record a row
(packed), a rank holding S = ceil(T / size) of its T tokens, every decoder layer checkpointed, the loss fused
(never more than one chunk of logits), and from S > TILE_FROM_TOKENS the MLP tiled. Per rank:

  fixed       model states and overhead: estimate_memory at one token
  per token   the layer checkpoints (layers x r x hidden), one layer recomputed with its input gradients
              (2 x the estimator's per-layer activation bytes; tiled: without the MLP's, plus its saved input),
              Ulysses' exchange buffers (2a(q + 2k) with SP), the loss's saved hidden-state gradient and the final
              norm ((4 + r + a) hidden)
  per row     one chunk of fp32 logits and its softmax gradient (8 x min(S, 4096) x vocab), and with tiling one
              tile's MLP activations twice (2 x mlp x min(S, tile))
  + 10% of the transient part for fragmentation (as the estimator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..model.seqparallel import (  # noqa: F401 - one place to
    fitting_sizes,
    heads_problem,
    sequence_parallel_problem,
    spec_without_reading,  # import the long-context names from
)
from ..model.spec import ModelSpec
from .estimate import FRAGMENTATION, GIB, RunShape, _layer_act_bytes, estimate_memory

TILE_FROM_TOKENS = 32768  # the worker's default: the MLP is tiled where a rank's share is longer (--tiled_mlp)
TILE_TOKENS = 8192  # --tiled_mlp_tokens' default
LOSS_CHUNK_ROWS = 4096  # the chunked loss's rows (Liger's are 2,048: the larger bounds both)
LONG_ROW_TOKENS = 16384  # from here a row is a long one: the long-row model, not the stock estimate


# ---------------------------------------------------------------- the longest record

def tiling_runs(world: int, zero_stage: int | None, sp_size: int) -> bool:
    """Where the worker can tile the MLP (training.long_context): one process, ZeRO-1/2, or ZeRO-3 with
    sequence parallelism over all ranks; not plain DDP over several."""
    if world <= 1:
        return True
    if zero_stage is None:
        return False
    return zero_stage != 3 or sp_size == world


def _mlp_act_bytes(spec: ModelSpec, run: RunShape, a: int) -> float:
    """The MLP's share of the estimator's per-layer activation bytes (gate, up, SiLU, product; with LoRA the
    adapted projections' dropout and cast copies)."""
    h, i = spec.hidden, spec.intermediate
    if run.method == "full":
        return 4 * a * i
    b = 3 * a * i
    per_in = (1 + a) if run.lora_dropout > 0 else a
    shapes = spec.module_shapes()
    for t in ("gate_proj", "up_proj", "down_proj"):
        if t in run.lora_targets and t in shapes:
            b += per_in * shapes[t][0] + a * run.lora_r
    if run.method == "qlora":
        b += a * (h + i)
    return b


@dataclass
class RowMemory:
    """One rank's memory for a row of `tokens` tokens on the worker's long-row path, GiB."""
    tokens: int
    share: int  # this rank's tokens
    fixed: float
    activations: float
    total: float
    tiled: bool
    notes: list[str] = field(default_factory=list)


def row_memory(spec: ModelSpec, training: Any, world: int, tokens: int, tiled: bool | None = None) -> RowMemory:
    """Peak memory of one rank for one row of `tokens` tokens (see the module doc)."""
    run = RunShape.of(training, micro_batch=1, gradient_checkpointing=True)
    sp = max(1, int(getattr(training, "sequence_parallel_size", 1) or 1))
    S = -(-int(tokens) // sp)
    if tiled is None:
        tiled = tiling_runs(world, run.zero_stage, sp) and S > TILE_FROM_TOKENS
    a = 2 if run.half else 4
    ds = run.zero_stage is not None and run.half
    lora = run.method in ("lora", "qlora")
    r = 4 if (not run.half or run.method == "qlora" or (not lora and not ds)) else 2
    h, L, V = spec.hidden, spec.layers, spec.vocab
    layer = _layer_act_bytes(spec, run, a, r)
    mlp = _mlp_act_bytes(spec, run, a)
    if tiled:
        layer = layer - mlp + a * h  # TiledMLP keeps its input; one tile's intermediates at a time (per row)
    per_token = L * r * h + 2 * layer + (4 + r + a) * h
    if sp > 1:
        per_token += 2 * a * (spec.q_dim + 2 * spec.kv_dim)  # the all-to-alls' buffers
    per_row = 8 * min(S, LOSS_CHUNK_ROWS) * V + (2 * mlp * min(S, TILE_TOKENS) if tiled else 0)
    transient = (per_token * S + per_row) * (1 + FRAGMENTATION)
    fixed = estimate_memory(spec, training, world, seq=1, micro_batch=1, gradient_checkpointing=True).total
    return RowMemory(tokens=int(tokens), share=S, fixed=fixed, activations=transient / GIB,
                     total=fixed + transient / GIB, tiled=bool(tiled))


def longest_record(spec: ModelSpec, training: Any, world: int, gpu_gib: float, limit: int = 1 << 24) -> int:
    """The longest record (tokens, a multiple of 1,024) whose row fits `gpu_gib` on the worker's long-row path,
    0 if not even 1,024 tokens fit. Memory grows with the tokens (tiling only lowers the slope from 32k on)."""
    def fits(t: int) -> bool:
        return row_memory(spec, training, world, t).total <= gpu_gib

    step = 1024
    if not fits(step):
        return 0
    lo, hi = step, 2 * step
    while hi <= limit and fits(hi):
        lo, hi = hi, 2 * hi
    hi = min(hi, limit + step)
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def is_long(training: Any) -> bool:
    """Rows long enough for the long-row model (a rank's share of model_max_length)."""
    sp = max(1, int(getattr(training, "sequence_parallel_size", 1) or 1))
    return math.ceil(training.model_max_length / sp) >= LONG_ROW_TOKENS
