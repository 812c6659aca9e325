"""Tokenized records -> data sets (through the tokenized cache), batches, and the data order.

Data order: one seeded permutation of the whole data set per epoch, cut into
global batches of world_size x micro_batch x accumulation records. Rank r takes
its slice of each global batch, so the order does not depend on the number of
processes and a resumed run continues exactly where the checkpoint left off.
Records beyond the last full global batch of an epoch are not used in that
epoch (every rank must run the same number of micro-batches).
"""

from __future__ import annotations

import torch

from training.data import token_cache
from training.data.encoding import IGNORE_INDEX, ChatEncoder, EagerDataset, Encoded, LazyDataset
from training.data.records import Conversation


def build_dataset(convs: list[Conversation], encoder: ChatEncoder, lazy: bool):
    """Lazy, or tokenized up front once per node through the tokenized cache (when the worker configured one)."""
    if lazy:
        return LazyDataset(convs, encoder)
    return token_cache.cached_dataset(convs, encoder, lambda: EagerDataset(convs, encoder),
                                      f"{len(convs)} records")


class Collator:
    """Pads a micro-batch to its own longest record (never to model_max_length)."""

    def __init__(self, pad_id: int, pad_to_multiple_of: int = 1):
        self.pad_id = pad_id
        self.multiple = pad_to_multiple_of

    def __call__(self, items: list[Encoded]) -> dict[str, torch.Tensor]:
        n = max(len(e.input_ids) for e in items)
        n = -(-n // self.multiple) * self.multiple
        ids = torch.full((len(items), n), self.pad_id, dtype=torch.long)
        labels = torch.full((len(items), n), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(items), n), dtype=torch.long)
        for row, e in enumerate(items):
            k = len(e.input_ids)
            ids[row, :k] = torch.tensor(e.input_ids)
            labels[row, :k] = torch.tensor(e.labels)
            mask[row, :k] = 1
        labels[:, 0] = IGNORE_INDEX  # never predicted (no previous token)
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "labels": labels,
            "truncated": torch.tensor(sum(e.truncated for e in items)),
        }


class StepSampler(torch.utils.data.Sampler):
    """Yields this rank's micro-batches (lists of record indices), optimizer step by optimizer step.

    Starts at `start_step` (a resumed run) and stops after `total_steps`.
    """

    def __init__(self, n_records: int, world_size: int, rank: int, micro_batch: int, accumulation: int,
                 seed: int, total_steps: int, start_step: int = 0):
        self.n = n_records
        self.world, self.rank = world_size, rank
        self.mb, self.gas = micro_batch, accumulation
        self.seed = seed
        self.global_batch = world_size * micro_batch * accumulation
        self.steps_per_epoch = n_records // self.global_batch
        self.total_steps, self.start_step = total_steps, start_step

    def _perm(self, epoch: int) -> list[int]:
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self):
        perm, perm_epoch = None, None
        for step in range(self.start_step, self.total_steps):
            epoch, k = divmod(step, self.steps_per_epoch)
            if epoch != perm_epoch:
                perm, perm_epoch = self._perm(epoch), epoch
            batch = perm[k * self.global_batch:(k + 1) * self.global_batch]
            for m in range(self.gas):
                start = (m * self.world + self.rank) * self.mb
                yield batch[start:start + self.mb]

    def __len__(self):
        return (self.total_steps - self.start_step) * self.gas


def eval_batches(n_records: int, world_size: int, rank: int, batch_size: int) -> list[list[int]]:
    """This rank's evaluation batches; every rank gets the same number (ZeRO-3 needs each forward on all ranks).

    An empty list stands for a padding batch that the evaluator runs with no labels.
    """
    mine = list(range(rank, n_records, world_size))
    per_rank = -(-n_records // world_size)
    n_batches = -(-per_rank // batch_size)
    return [mine[i * batch_size:(i + 1) * batch_size] for i in range(n_batches)]
