"""DPO on the fast path: preference pairs packed into rows, and the loss over the answers' log-probabilities.

pack_pairs()      a step's pairs -> packed rows: each pair's chosen and rejected sequences side by side in one row
                  (a pair is never split: its loss needs both), rows balanced as training.fast.packing balances
                  records; positions restart and attention stops at every sequence, as for chat records
PreferenceLoss    FastLoss for DPO: one row -> (summed pair losses, the pairs' reward sums); the decoder runs once
                  over both answers of every pair in the row, the LM head only on their supervised positions,
                  chunk by chunk without keeping the logits (recomputed in the backward)
dpo_losses()      the losses of TRL's and LLaMA-Factory's DPO: sigmoid (Rafailov et al.), IPO (Azar et al., on
                  log-probabilities averaged over the answer's tokens), plus the SFT term on the chosen answer
                  (pref_ftx, TRL's rpo_alpha): each pair's own loss and rewards, beta x (policy - reference)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.fast.apply import FastLoss
from training.fast.packing import balanced_bins, pack, segment_ids

LOSSES = ("sigmoid", "ipo")
STATS = ("rewards_chosen", "rewards_rejected", "rewards_accuracy", "logps_chosen", "logps_rejected")
LOGP_CHUNK = 4096  # rows of logits at a time (float32: 4096 x 152k x 4 B = 2.5 GB at Qwen's vocabulary)


def pack_pairs(items, capacity: int, pad_id: int, pad_multiple: int | None, max_segment: int) -> list[dict]:
    """One step's pairs (training.data.pairs.PairItem) of this rank as packed rows. Each row also carries
    loss_seq (the sequence each supervised position belongs to: 2k chosen, 2k + 1 rejected, for its k-th pair),
    ref (the pairs' reference log-probabilities, float64 [pairs, 2]), pairs (how many) and index (their positions
    in the data set)."""
    rows = []
    for b in balanced_bins([p.tokens for p in items], capacity):
        pairs = [items[i] for i in b]
        row = pack([s for p in pairs for s in (p.chosen, p.rejected)], capacity, pad_id, pad_multiple, max_segment)
        width = row["input_ids"].shape[1]
        row["loss_seq"] = segment_ids(row["cu_seq_lens"], width)[row["loss_positions"]]
        row["ref"] = torch.tensor([p.ref if p.ref is not None else (0.0, 0.0) for p in pairs], dtype=torch.float64)
        row["pairs"] = len(pairs)
        row["index"] = torch.tensor([p.index for p in pairs], dtype=torch.long)
        rows.append(row)
    return rows


def empty_pair_row(width: int, pad_id: int, max_segment: int) -> dict:
    """A row of padding with no pair in it, for a rank with fewer rows than the busiest: it runs the same modules as
    a row of pairs (under ZeRO-3 every rank must gather the same weights in the same order) and adds nothing."""
    from training.fast.apply import empty_row

    row = empty_row(width, pad_id, max_segment)
    row["loss_seq"] = torch.zeros(0, dtype=torch.long)
    row["ref"] = torch.zeros((0, 2), dtype=torch.float64)
    row["pairs"] = 0
    row["index"] = torch.zeros(0, dtype=torch.long)
    return row


def _chunk_logps(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = h @ w.t()
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return logits.gather(1, y.unsqueeze(1)).squeeze(1) - torch.logsumexp(logits, dim=-1)


def token_logps(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = LOGP_CHUNK) -> torch.Tensor:
    """log p(target) of every row of h (N, H) under the LM head `weight` (V, H), chunk by chunk: at most one
    chunk of logits exists at a time, and with gradients each chunk's logits are recomputed in the backward."""
    w = weight if weight.dtype == h.dtype else weight.to(h.dtype)
    if h.shape[0] == 0:
        return (h.sum() * 0.0 + w.view(-1)[0] * 0.0).float().reshape(1)[:0]
    if not torch.is_grad_enabled():
        return torch.cat([_chunk_logps(h[a:a + chunk], w, targets[a:a + chunk]) for a in range(0, h.shape[0], chunk)])
    from torch.utils.checkpoint import checkpoint

    return torch.cat([checkpoint(_chunk_logps, h[a:a + chunk], w, targets[a:a + chunk], use_reentrant=False)
                      for a in range(0, h.shape[0], chunk)])


def dpo_losses(chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor,
               n_chosen: torch.Tensor, n_rejected: torch.Tensor, beta: float, loss: str = "sigmoid",
               ftx: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per pair: (loss, chosen reward, rejected reward) from the summed log-probabilities of the answers under the
    policy and the reference, and the answers' supervised token counts."""
    if loss == "ipo":  # IPO's regression target is on per-token averages (as TRL computes it)
        pc, pr, rc, rr = chosen / n_chosen, rejected / n_rejected, ref_chosen / n_chosen, ref_rejected / n_rejected
    else:
        pc, pr, rc, rr = chosen, rejected, ref_chosen, ref_rejected
    logits = (pc - pr) - (rc - rr)
    if loss == "sigmoid":
        losses = -F.logsigmoid(beta * logits)
    elif loss == "ipo":
        losses = (logits - 1.0 / (2.0 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO loss {loss!r}; known: {', '.join(LOSSES)}")
    if ftx:  # the chosen answer's negative log-likelihood a token (LLaMA-Factory's pref_ftx)
        losses = losses + ftx * (-chosen / n_chosen)
    return losses, beta * (pc - rc).detach(), beta * (pr - rr).detach()


class _ProbePair:
    """A pair of the memory probe's records (training.data.pairs.PairItem's fields that pack_pairs reads)."""

    def __init__(self, chosen, rejected, index: int):
        self.chosen, self.rejected, self.index, self.ref = chosen, rejected, index, (0.0, 0.0)
        self.tokens = len(chosen.input_ids) + len(rejected.input_ids)


class HeadLogps(torch.nn.Module):
    """The LM head on a packed row's supervised positions -> their log-probabilities. Holds the head outside the
    module tree, as training.fast.apply.HeadLoss does (under ZeRO-3 its weight is this module's external
    parameter, gathered for its forward and backward)."""

    def __init__(self, head):
        super().__init__()
        self.__dict__["_head"] = head

    def forward(self, hidden: torch.Tensor, batch: dict) -> torch.Tensor:
        h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch["loss_positions"])
        return token_logps(h, self._head.weight, batch["loss_targets"])


class PreferenceLoss(FastLoss):
    """model + the DPO loss: forward(row) -> (summed losses of the row's pairs, their STATS sums). With
    row["reference"] set it returns the answers' summed log-probabilities and token counts instead (the
    reference pass, under no_grad). The memory probe's rows are pairs too (probe_row): a DPO step's memory is
    its own (two answers a pair; the head's float32 log-probabilities recomputed chunk by chunk in the
    backward, while every activation is alive), not SFT's. A row without pairs gets the chat loss."""

    SEQUENCES = 2  # a pair's chosen and rejected answers share one row
    SAMPLE = "pair"

    def __init__(self, model, ce: str, max_segment: int, labelled_only: bool, beta: float, loss: str, ftx: float):
        super().__init__(model, ce, max_segment, labelled_only)
        from training.fast.compile import lm_head_of

        self.head_logps = HeadLogps(lm_head_of(model))
        self.beta, self.loss, self.ftx = beta, loss, ftx

    def forward(self, batch: dict):
        if "loss_seq" not in batch:
            return super().forward(batch)
        from training.fast.step import decoder_hidden

        hidden = decoder_hidden(self.model, batch, self.max_segment)
        logp = self.head_logps(hidden, batch)
        n_seq = 2 * int(batch["pairs"])
        seq = torch.zeros(n_seq, dtype=logp.dtype, device=logp.device).index_add(0, batch["loss_seq"], logp)
        count = torch.zeros(n_seq, dtype=logp.dtype, device=logp.device).index_add(
            0, batch["loss_seq"], torch.ones_like(logp))
        if batch.get("reference"):
            return seq.detach(), count
        ref = batch["ref"].to(device=logp.device, dtype=logp.dtype)
        losses, rc, rr = dpo_losses(seq[0::2], seq[1::2], ref[:, 0], ref[:, 1], count[0::2], count[1::2], self.beta,
                                    self.loss, self.ftx)
        stats = torch.stack([rc.sum(), rr.sum(), (rc > rr).to(rc.dtype).sum(), seq[0::2].detach().sum(),
                             seq[1::2].detach().sum()])
        return losses.sum(), stats

    def probe_row(self, tokens: int, vocab: int, length: int) -> dict:
        """A row of `tokens` tokens of pairs whose two answers are `length` tokens each, every token supervised,
        with reference log-probabilities: what a training row of that width at most runs."""
        from training.fast.apply import ProbeRecord

        n = tokens // (2 * length)
        pairs = [_ProbePair(ProbeRecord(2 * k, length, vocab), ProbeRecord(2 * k + 1, length, vocab), k)
                 for k in range(n)]
        (row,) = pack_pairs(pairs, tokens, 0, None, length)
        return row

    def shard_head_weight(self) -> None:
        import deepspeed

        super().shard_head_weight()
        deepspeed.zero.register_external_parameter(self.head_logps, self.head_logps._head.weight)
