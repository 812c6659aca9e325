"""Preference pairs -> token ids and labels, for DPO (training.fast.preference computes the loss).

Each pair is two conversations sharing a prompt (training.data.records.PreferencePair), encoded by the worker's
ChatEncoder: the labels cover the answer's assistant turns only (their text and tool calls), never the prompt's
turns, tool results or the tools' schema. A pair whose chosen or rejected side has no label left after the cut
to --model_max_length is dropped whole. The tokenized pairs go through the tokenized cache like chat records
(flat: chosen, rejected, chosen, ...), so every node tokenizes them once.

`ref` holds the reference model's summed log-probabilities of the two answers once the recipe has computed them
(training.preference): the loss compares the policy's with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training.data import token_cache
from training.data.encoding import IGNORE_INDEX, ChatEncoder, DataStats, EagerDataset, Encoded, _has_labels


@dataclass
class PairItem:
    chosen: Encoded
    rejected: Encoded
    index: int  # position in the data set (the reference log-probabilities are kept by it)
    ref: tuple[float, float] | None = None

    @property
    def truncated(self) -> bool:
        return self.chosen.truncated or self.rejected.truncated

    @property
    def tokens(self) -> int:
        return len(self.chosen.input_ids) + len(self.rejected.input_ids)


class PairDataset(torch.utils.data.Dataset):
    """The usable pairs, each with its position."""

    def __init__(self, items: list[PairItem], stats: DataStats):
        self.items, self.stats = items, stats

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i: int) -> PairItem:
        return self.items[i]


def _encode_flat(pairs, encoder: ChatEncoder) -> EagerDataset:
    """Both sides of every usable pair, flat (the tokenized cache's form); a pair without labels on either side
    after the cut is dropped whole."""
    ds = EagerDataset.__new__(EagerDataset)
    ds.items, ds.stats = [], DataStats(records=len(pairs))
    for p in pairs:
        c, r = encoder.encode(p.chosen), encoder.encode(p.rejected)
        if c.truncated or r.truncated:
            ds.stats.truncated += 1
            ds.stats.truncated_ids.append(p.id)
        if not (_has_labels(c) and _has_labels(r)):
            ds.stats.dropped += 1
            continue
        for e in (c, r):
            ds.stats.tokens += len(e.input_ids)
            ds.stats.label_tokens += sum(1 for x in e.labels if x != IGNORE_INDEX)
        ds.items += [c, r]
    return ds


def build_pair_dataset(pairs, encoder: ChatEncoder) -> PairDataset:
    """The tokenized pairs, through the tokenized cache when the worker configured one."""
    flat = token_cache.cached_dataset(pairs, encoder, lambda: _encode_flat(pairs, encoder), f"{len(pairs)} pairs")
    items = [PairItem(flat.items[2 * i], flat.items[2 * i + 1], i) for i in range(len(flat.items) // 2)]
    return PairDataset(items, flat.stats)
