"""Padding-free batches: records packed end to end into one row of a fixed token budget.

A packed micro-batch is one row of `capacity` tokens. position_ids restart at 0 at every
record (so RoPE sees each record as if it were alone), and `cu_seq_lens` marks the record
boundaries for the attention (training.fast.attention), which never lets a token attend across
them. The first label of every record is -100, so the last token of one record is never
trained to predict the first token of the next (the loss shifts labels by one over the row).
The tail of the row that no record fills is padding: its own segment, all labels -100; it costs
compute but carries no loss and is not counted as a real token.

A step's records go into as few rows as fit, and those rows are balanced (longest record first,
each into the least-filled row it fits): a step of 34k tokens with 31k-token rows becomes two
rows of 17k rather than 31k plus a 3k remainder, whose fixed costs per micro-batch (the loss's
pass over the LM head, the weight casts, the gradient accumulation) are the same as a full row's
for a tenth of the work. Within a row, records keep the sampler's order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from training.data.encoding import IGNORE_INDEX  # the label of a token the loss skips


def first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Groups record indices into bins whose summed length is at most `capacity`, first fit in order."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(lengths):
        if n > capacity:
            raise ValueError(f"record {i} has {n} tokens, more than the packing capacity {capacity}")
        if n <= 0:
            raise ValueError(f"record {i} is empty")
        for b, r in enumerate(room):
            if n <= r:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(capacity - n)
    return bins


def balanced_bins(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Record indices in the fewest rows (found from ceil(total/capacity) up) whose loads are balanced:
    longest first, each into the least-filled row with room (LPT). Indices ascend within a row."""
    for i, n in enumerate(lengths):
        if n > capacity:
            raise ValueError(f"record {i} has {n} tokens, more than the packing capacity {capacity}")
        if n <= 0:
            raise ValueError(f"record {i} is empty")
    if not lengths:
        return []
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    k = -(-sum(lengths) // capacity)
    while True:
        load, bins = [0] * k, [[] for _ in range(k)]
        for i in order:
            b = min((j for j in range(k) if load[j] + lengths[i] <= capacity), key=lambda j: load[j], default=None)
            if b is None:
                break
            bins[b].append(i)
            load[b] += lengths[i]
        else:
            return [sorted(b) for b in bins if b]
        k += 1


def pack(items: Sequence, capacity: int, pad_id: int, pad_multiple: int | None = None,
         max_segment: int | None = None) -> dict:
    """Packs records (objects with .input_ids and .labels lists) into one row.

    The row is `capacity` tokens wide, or with `pad_multiple` only as wide as its records rounded up
    to that multiple (fewer distinct shapes for a compiled model than exact widths, less padding
    than the full capacity). The padding tail is split into segments of at most `max_segment`
    tokens, so `max_segment` (the longest record allowed) bounds every segment and can be passed
    to the attention as a constant.

    Returns input_ids, labels, position_ids of shape (1, T); cu_seq_lens (int32, one more than the
    number of segments); max_length (longest segment); real_tokens (tokens of records, padding
    excluded); records; loss_positions (int64: the positions t whose next label is supervised, the
    only ones whose logits the loss needs) and loss_targets (those labels), found here on the host
    so the device never has to be asked how many there are.
    """
    total = sum(len(e.input_ids) for e in items)
    if total > capacity:
        raise ValueError(f"{total} tokens do not fit in a packed row of {capacity}")
    width = capacity if not pad_multiple else min(capacity, -(-total // pad_multiple) * pad_multiple)
    ids = torch.full((1, width), pad_id, dtype=torch.long)
    labels = torch.full((1, width), IGNORE_INDEX, dtype=torch.long)
    pos = torch.zeros((1, width), dtype=torch.long)
    cu = [0]
    at = 0
    for e in items:
        n = len(e.input_ids)
        ids[0, at:at + n] = torch.as_tensor(e.input_ids, dtype=torch.long)
        labels[0, at:at + n] = torch.as_tensor(e.labels, dtype=torch.long)
        labels[0, at] = IGNORE_INDEX  # never predicted from the previous record
        pos[0, at:at + n] = torch.arange(n)
        at += n
        cu.append(at)
    step = max_segment or width
    while at < width:  # the padding tail: segments of their own
        n = min(step, width - at)
        pos[0, at:at + n] = torch.arange(n)
        at += n
        cu.append(at)
    seg_lens = [b - a for a, b in zip(cu[:-1], cu[1:])]
    nxt = labels[0, 1:]
    loss_positions = (nxt != IGNORE_INDEX).nonzero().squeeze(1)
    return {
        "input_ids": ids,
        "labels": labels,
        "position_ids": pos,
        "cu_seq_lens": torch.tensor(cu, dtype=torch.int32),
        "max_length": max(seg_lens),
        "real_tokens": total,
        "records": len(items),
        "loss_positions": loss_positions,
        "loss_targets": nxt[loss_positions],
    }


def pack_batches(items: Sequence, capacity: int, pad_id: int, pad_multiple: int | None = None,
                 max_segment: int | None = None) -> list[dict]:
    """All of `items` (one optimizer step's records, say) as balanced packed rows of at most `capacity` tokens."""
    bins = balanced_bins([len(e.input_ids) for e in items], capacity)
    return [pack([items[i] for i in b], capacity, pad_id, pad_multiple, max_segment) for b in bins]


def segment_ids(cu_seq_lens: torch.Tensor, width: int) -> torch.Tensor:
    """Segment number of every position of a packed row (for checks and the CPU attention)."""
    lens = (cu_seq_lens[1:] - cu_seq_lens[:-1]).long()
    return torch.repeat_interleave(torch.arange(len(lens)), lens)[:width]
