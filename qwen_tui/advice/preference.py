"""Advice for DPO (training.stage: dpo): the usual traps of preference training, with this preset's numbers.

DPO_BETA           beta outside the range DPO is usually run with (0.01-0.5): too small lets the policy drift far
                   from the reference (the rewards run away, the text degrades); too large barely moves it
DPO_LEARNING_RATE  a learning rate at SFT's: DPO's is usually an order below (full 5e-7 to 5e-6, LoRA 5e-6 to 5e-5);
                   at SFT's the margin grows fast and the chosen answer's likelihood falls with the rejected one's
DPO_REFERENCE      the model is not an SFT model (a base release, or the tiny built-in one): DPO's reference is the
                   model it starts from, and a base model's answers are not the chat the pairs were written for
DPO_COST           what a DPO step costs against SFT's: both answers of every pair through the policy (forward and
                   backward), one forward of each through the reference before the first step
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..base.levels import Level
from .core import Advice, Context, Fix, rule

BETA_RANGE = (0.01, 0.5)
LR_MAX = {"full": 1e-5, "lora": 1e-4, "qlora": 1e-4}  # above these, an SFT-sized learning rate
LR_SUGGEST = {"full": 1e-6, "lora": 2e-5, "qlora": 2e-5}
_CHAT = re.compile(r"(instruct|chat|sft|-it\b|merged|checkpoint|output)", re.IGNORECASE)


def _dpo(c: Context) -> bool:
    return c.t.stage == "dpo"


@rule
def dpo_beta(c: Context) -> Iterable[Advice]:
    lo, hi = BETA_RANGE
    if not _dpo(c) or lo <= c.t.pref_beta <= hi:
        return
    why = ("lets the policy drift far from the reference: rewards run away and the text degrades"
           if c.t.pref_beta < lo else "keeps the policy close to the reference: it barely learns the preference")
    yield Advice(Level.WARNING, "DPO_BETA", f"pref_beta {c.t.pref_beta:g} is outside DPO's usual {lo:g}-{hi:g}: it {why}",
                 Fix("beta 0.1 (TRL's and LLaMA-Factory's default)", {"training.pref_beta": 0.1}))


@rule
def dpo_learning_rate(c: Context) -> Iterable[Advice]:
    if not _dpo(c) or c.t.learning_rate <= LR_MAX[c.t.method]:
        return
    lr = LR_SUGGEST[c.t.method]
    yield Advice(Level.WARNING, "DPO_LEARNING_RATE",
                 f"learning_rate {c.t.learning_rate:g} is an SFT learning rate for {c.t.method}: DPO's is usually an "
                 f"order below (here at most {LR_MAX[c.t.method]:g}); at SFT's the margin grows fast while the chosen "
                 "answers' likelihood falls with the rejected ones'",
                 Fix(f"learning_rate {lr:g}", {"training.learning_rate": lr}))


@rule
def dpo_reference(c: Context) -> Iterable[Advice]:
    if not _dpo(c):
        return
    model = c.t.model
    if model.startswith("builtin:") or (not _CHAT.search(model) and "/" in model and not model.startswith((".", "/", "~"))):
        yield Advice(Level.WARNING, "DPO_REFERENCE",
                     f"{model} does not look like an SFT model: DPO's reference is the model it starts from, and it "
                     "should be the SFT model whose answers the pairs compare (an -Instruct release, or your SFT run's "
                     "merged output)",
                     Fix("start from the SFT run's merged model", hint="the Run view's m (or qwen-tui merge) writes "
                         "OUTPUT_DIR/merged; set training.model to it"))


@rule
def dpo_cost(c: Context) -> Iterable[Advice]:
    if not _dpo(c):
        return
    yield Advice(Level.INFO, "DPO_COST",
                 "a DPO step trains both answers of every pair: twice the tokens of an SFT step on the same "
                 "per_device_train_batch_size (the memory of a packed row of two sequences a pair); the reference "
                 "runs once, one forward of each answer before the first step (a third of an epoch's step time), "
                 "and never beside the policy: no second model in memory")
