"""Sequence parallelism: one packed row spread over the ranks of a group, for records longer than one GPU holds.

The engine is DeepSpeed's Ulysses attention for Hugging Face models (Arctic Long Sequence Training,
deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF). Every rank of a sequence-parallel (SP)
group gets the same packed row and keeps 1/size of its tokens (shard_row): embeddings, MLPs, norms and the loss
run on that share only. Around each attention call two all-to-alls trade the sequence split for a head split:
each rank attends over the whole row for heads/size of the heads (so key/value heads must divide among the ranks,
or the ranks among them: check_shape), with the row's record boundaries unchanged (the worker's packed
attention, training.fast.attention, runs inside the Ulysses wrapper). In evaluation the wrapper steps aside and
every rank evaluates whole records of its own.

Data: the ranks of one SP group (consecutive ranks, rank // size) are one data-parallel replica; the sampler
deals records to the world / size groups (data_env). Loss: each rank sums the token losses of its share, and
the recipe divides every rank's sum by the supervised tokens of the whole optimizer step over all groups
(each token counted once: packed counts are divided by size) times the world size, as without SP. The engine
(DDP or ZeRO) averages gradients over all ranks, so the gradient is d(sum of every token's loss) / (supervised
tokens of the step), exactly the one-process gradient. The gradient of a rank's query/key/value projections comes
back through the all-to-all's backward from the ranks that attended with them, so no rank's share is missing.

The labels are shifted on the host before the row is cut (a share's last token predicts the next share's first
label): shards carry the positions and targets of their supervised tokens, and the loss runs on those only.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch

from training.data.encoding import IGNORE_INDEX  # the label of a token the loss skips
from training.flags import FastFlags
from training.runtime import unused_imports
from training.runtime.errors import InputError

log = logging.getLogger("training")

_active: "SequenceParallel | None" = None  # the process's group, once install() has run


def check_shape(size: int, world_size: int, model_config: dict, flag: str = "--sequence_parallel_size") -> None:
    """What Ulysses needs of the world and the model's heads; raises InputError naming `flag`."""
    if size < 1:
        raise InputError(f"{flag} must be at least 1, got {size}")
    if size == 1:
        return
    if world_size % size:
        raise InputError(f"{flag} {size} does not divide the {world_size} process(es): every rank must be in "
                         "one sequence-parallel group")
    heads = int(model_config.get("num_attention_heads") or 0)
    kv = int(model_config.get("num_key_value_heads") or heads)
    unfit = shape_unfit(size, heads, kv)
    if unfit:
        raise InputError(f"{flag} {size}: {unfit}")


def shape_unfit(size: int, heads: int, kv_heads: int) -> str | None:
    """Why Ulysses cannot split these heads over `size` ranks, or None: each rank attends for heads / size query
    heads, and the key/value heads are split among the ranks (kv % size == 0) or copied to them (size % kv == 0)."""
    if size <= 1:
        return None
    if heads % size:
        return f"the model's {heads} attention heads do not divide among {size} ranks"
    if kv_heads % size and size % kv_heads:
        return (f"the model's {kv_heads} key/value heads and {size} ranks: one must divide the other "
                f"(try {', '.join(str(d) for d in _fitting_sizes(heads, kv_heads)) or '1'})")
    return None


def _fitting_sizes(heads: int, kv: int) -> list[int]:
    return [s for s in range(2, heads + 1) if heads % s == 0 and (kv % s == 0 or s % kv == 0)][:6]


def engine_missing() -> str | None:
    """Why DeepSpeed's Ulysses attention for HF models cannot be used here, or None."""
    try:
        import inspect

        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    except ImportError as e:
        return f"it needs DeepSpeed's Ulysses attention (pip install 'deepspeed>=0.19'): {e}"
    if "disable_in_eval" not in inspect.signature(UlyssesSPAttentionHF.__init__).parameters:
        return "this DeepSpeed's Ulysses attention is older than the worker's (pip install 'deepspeed>=0.19')"
    return None


def check_fast_path(size: int, given: FastFlags, fast) -> None:
    """SP (--sequence_parallel_size `size`) shards packed rows: packing is needed. Compiled layers are turned off
    unless asked for in `given` (the Ulysses wrapper's collectives sit inside every layer; they were never
    measured compiled)."""
    if size <= 1:
        return
    missing = engine_missing()
    if missing:
        raise InputError(f"--sequence_parallel_size {size}: {missing}")
    if not fast.packing:
        raise InputError(f"--sequence_parallel_size {size} shards packed rows; it needs packing (drop --no_packing)")
    if fast.compile and given.compile is None:
        fast.compile = False
        fast.why["compile"] = "off: sequence parallelism (its all-to-alls run inside every layer)"
    fast.labelled_logits = True
    fast.why["labelled_logits_only"] = "on: sequence parallelism (each rank's share of the shifted labels)"


@dataclasses.dataclass
class SequenceParallel:
    size: int
    rank: int  # within the SP group
    group: object  # torch.distributed process group of this rank's SP group
    pad_id: int = 0

    def shard_row(self, row: dict) -> dict:
        """This rank's share of a packed row (training.fast.packing.pack): the row is padded to a multiple of
        the SP size with a padding segment, cut into `size` equal shares; the record boundaries stay the whole
        row's (the attention sees the whole row), and loss_positions/loss_targets become the share's own."""
        return shard_row(row, self.size, self.rank, self.pad_id)


def shard_row(row: dict, size: int, rank: int, pad_id: int) -> dict:
    width = int(row["input_ids"].shape[1])
    extra = (-width) % size
    ids, labels, pos, cu = row["input_ids"], row["labels"], row["position_ids"], row["cu_seq_lens"]
    if extra:  # a padding segment of its own: no labels, positions from 0, its own boundary
        ids = torch.cat([ids, torch.full((1, extra), pad_id, dtype=ids.dtype)], dim=1)
        labels = torch.cat([labels, torch.full((1, extra), IGNORE_INDEX, dtype=labels.dtype)], dim=1)
        pos = torch.cat([pos, torch.arange(extra, dtype=pos.dtype).unsqueeze(0)], dim=1)
        cu = torch.cat([cu, torch.tensor([width + extra], dtype=cu.dtype)])
        width += extra
    share = width // size
    a, b = rank * share, (rank + 1) * share
    positions = row["loss_positions"]
    mine = (positions >= a) & (positions < b)
    out = dict(row)
    out.update({
        "input_ids": ids[:, a:b].contiguous(), "position_ids": pos[:, a:b].contiguous(),
        "labels": labels[:, a:b].contiguous(),  # unshifted, for inspection; the loss uses the positions below
        "cu_seq_lens": cu, "max_length": max(int(row["max_length"]), extra),
        "loss_positions": positions[mine] - a, "loss_targets": row["loss_targets"][mine],
        "sp_share": (a, b, width),
    })
    return out


def local(row: dict) -> dict:
    """The row as this rank runs it: its share under SP, the row itself otherwise."""
    return _active.shard_row(row) if _active is not None else row


def active() -> "SequenceParallel | None":
    return _active


def size() -> int:
    return _active.size if _active is not None else 1


def pad_multiple(base: int) -> int:
    """Row widths rounded to `base` and to the SP size (every share the same width)."""
    return base * size() // math.gcd(base, size())


def data_env(env, sp_size: int):
    """The data-parallel view of the world: one 'rank' per SP group (the sampler deals records to these)."""
    if sp_size <= 1:
        return env
    return dataclasses.replace(env, world_size=env.world_size // sp_size, rank=env.rank // sp_size)


def make_groups(sp_size: int, world_size: int, rank: int, timeout_s: float):
    """Every rank creates every SP group (torch.distributed's rule); returns this rank's. Consecutive ranks form
    a group, so a group of up to a node's GPUs stays on that node's links. Its collectives wait at most
    timeout_s (the worker's --ddp_timeout), as the default group's do."""
    import datetime

    import torch.distributed as tdist

    mine = None
    for g in range(world_size // sp_size):
        ranks = list(range(g * sp_size, (g + 1) * sp_size))
        group = tdist.new_group(ranks, timeout=datetime.timedelta(seconds=timeout_s))
        if rank in ranks:
            mine = group
    return mine


def install(model, model_config: dict, sp_size: int, world_size: int, rank: int, pad_id: int,
            loss_module=None, timeout_s: float = 1800.0) -> SequenceParallel:
    """Wraps the packed attention in Ulysses for every attention layer of `model` and makes this process's
    rows shard (local()). Runs after the fast path has switched the model to the packed attention."""
    global _active
    import deepspeed
    import deepspeed.comm as ds_comm
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers import AttentionInterface

    from training.fast.attention import NAME, packed_attention_forward

    if not ds_comm.is_initialized():
        on_gpu = torch.cuda.is_available() and next(model.parameters()).is_cuda
        unused_imports.skip_deepspeed_cpu_shm_op("cuda" if on_gpu else "cpu")
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    group = make_groups(sp_size, world_size, rank, timeout_s)
    heads = int(model_config["num_attention_heads"])
    uattn = UlyssesSPAttentionHF(
        attn=packed_attention_forward, batch_size=1, attn_head_count=heads,
        attn_head_size=int(model_config.get("head_dim") or int(model_config["hidden_size"]) // heads),
        kv_head_count=int(model_config.get("num_key_value_heads") or heads),
        num_hidden_layers=int(model_config["num_hidden_layers"]), process_group=group,
        seq_length_is_variable=True, disable_in_eval=True)

    def ulysses(module, query, key, value, attention_mask, *args, **kwargs):
        # Boundaries travel as packed_cu_seq_lens (the whole row's); the packed attention builds no mask.
        return uattn(module, query, key, value, None, *args, **kwargs)

    AttentionInterface.register(NAME, ulysses)
    if loss_module is not None:
        loss_module.head_loss.labelled_only = True  # shares carry their own shifted targets
    _active = SequenceParallel(sp_size, rank % sp_size, group, pad_id)
    log.info("sequence parallelism: %d ranks a group (%d group(s)), rank %d holds share %d of every row",
             sp_size, world_size // sp_size, rank, rank % sp_size)
    return _active


def uninstall() -> None:
    """Forgets the group (tests that build several workers in one process)."""
    global _active
    _active = None
