"""DPO's reference: the log-probabilities of every pair's answers under the model as it starts, computed once.

The reference of DPO is the model before preference training (the SFT model). Its log-probabilities of the
chosen and the rejected answer of every pair are computed in one pass before the first step, with the same packed
rows and kernels as training (in eval mode: no dropout), and kept with the pairs: no second model is loaded, none
runs beside the policy during training, and a DPO step costs what a step on the same tokens costs in SFT.
- LoRA / Q-LoRA: the pass runs with the adapters disabled (peft's disable_adapter), so it is the base model
  whenever it runs, and a resumed run recomputes it.
- Full fine-tuning: the policy is the reference only before the first step. The pass runs then, and the values are
  written to OUTPUT_DIR/dpo_reference.pt (keyed by the data and the model); a resumed run reads them back.
Under ZeRO-3 every rank runs the same number of forwards (ranks with fewer pairs run empty rows): the weights are
gathered collectively. Each rank computes its share; one all-reduce gives every rank all of them.

evaluate_pairs() is the evaluation of a DPO run: the loss, rewards and accuracy on --eval_data_path's pairs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from pathlib import Path

import torch

from training.fast.preference import STATS, empty_pair_row, pack_pairs
from training.fast.step import to_device
from training.runtime import dist
from training.runtime.errors import InputError

log = logging.getLogger("training")
FILE = "dpo_reference.pt"


def _adapters_off(model, method: str):
    return model.disable_adapter() if method != "full" and hasattr(model, "disable_adapter") else \
        contextlib.nullcontext()


def _rows(recipe, items) -> list[dict]:
    a, f = recipe.args, recipe.fast
    multiple = 128 if recipe.device.type == "cuda" else 8  # the step loop's row widths
    return pack_pairs(items, f.packing_tokens, recipe.tokenizer.pad_token_id, multiple, a.data.model_max_length)


def _forwards(recipe, rows: list[dict], reference: bool):
    """(row, output) of this rank's rows, after as many empty rows as the busiest rank has more: ZeRO-3 gathers
    weights in every forward, so every rank runs the same number. Under no_grad; the module as evaluate() uses it."""
    a = recipe.args
    most = int(dist.all_reduce_max(torch.tensor([float(len(rows))], dtype=torch.float64,
                                                device=recipe.device)).item())
    module = recipe.engine if recipe.engine is not None else recipe.loss_module
    filler = empty_pair_row(8, recipe.tokenizer.pad_token_id, a.data.model_max_length)
    for r in range(most):
        row = rows[r] if r < len(rows) else {**filler, "reference": reference}
        yield row, module(to_device(row, recipe.device))


def _pass(recipe, ds, reference: bool, timing: dict | None = None) -> torch.Tensor:
    """Reference pass: [pairs, 2] summed log-probabilities (float64). Evaluation pass: [1 + STATS + 1] sums of
    the loss, the STATS and the pairs. Over every rank. timing (a dict, filled): this rank's rows and tokens, the
    pass's seconds and its first row's (which compiles the no-grad graph of the compiled layers)."""
    env = recipe.env
    mine = [ds[i] for i in range(env.rank, len(ds), env.world_size)]
    rows = _rows(recipe, mine)
    started, first = time.monotonic(), None
    out = torch.zeros((len(ds), 2) if reference else (len(STATS) + 2,), dtype=torch.float64)
    wrapped = recipe.wrapped
    wrapped.eval()
    off = _adapters_off(recipe.model, recipe.method) if reference else contextlib.nullcontext()
    try:
        with torch.no_grad(), off, recipe._autocast():
            for row, res in _forwards(recipe, [{**r, "reference": True} for r in rows] if reference else rows,
                                      reference):
                if not row["pairs"]:
                    continue  # an empty row: nothing of its own
                if reference:
                    seq, _ = res
                    out[row["index"]] = seq.detach().double().cpu().view(-1, 2)  # waits for the row
                    if first is None:
                        first = (time.monotonic() - started, sum(ds[int(i)].tokens for i in row["index"]))
                else:
                    loss, stats = res
                    out += torch.cat([loss.detach().double().cpu().view(1), stats.double().cpu(),
                                      torch.tensor([float(row["pairs"])], dtype=torch.float64)])
    finally:
        wrapped.train()
    if timing is not None:
        timing.update(rows=len(rows), tokens=sum(p.tokens for p in mine), seconds=time.monotonic() - started,
                      first_row_seconds=first[0] if first else None, first_row_tokens=first[1] if first else None)
    return dist.all_reduce_sum(out.to(recipe.device)).cpu()


def _key(recipe, ds, name: str) -> str:
    a = recipe.args
    meta = [name, len(ds), getattr(ds, "key", None), a.model.model_name_or_path, recipe.method,
            a.data.model_max_length, str(recipe._load_dtype())]
    return hashlib.sha256(json.dumps(meta, default=str).encode()).hexdigest()[:32]


def attach_reference(recipe) -> None:
    """Computes (or, resuming full fine-tuning, reads) the reference log-probabilities of the training and the
    evaluation pairs and keeps them on the pairs."""
    a, env = recipe.args, recipe.env
    sets = {"train": recipe.train_ds, **({"eval": recipe.eval_ds} if recipe.eval_ds is not None else {})}
    path = Path(a.train.output_dir) / FILE
    keys = {name: _key(recipe, ds, name) for name, ds in sets.items()}
    values = None
    if recipe.resume_dir is not None and recipe.method == "full":
        # the weights are no longer the reference: only the values computed before the first step will do
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, ValueError) as e:
            raise InputError(f"{path}: resuming full-parameter DPO needs the reference log-probabilities computed at "
                             f"the start of the run ({type(e).__name__}: {e})") from None
        if saved.get("keys") != keys:
            raise InputError(f"{path}: its reference log-probabilities are of other data or another model; resume "
                             "with the data and model the run started with")
        values = saved["values"]
    if values is None:
        t0 = time.monotonic()
        timing: dict = {}
        values = {name: _pass(recipe, ds, reference=True, timing=timing if name == "train" else None)
                  for name, ds in sets.items()}
        recipe.reference_timing = {"pairs": len(recipe.train_ds), **timing}
        if env.is_main:
            log.info("DPO reference: log-probabilities of %s pairs computed in %.1f s (%s; the first row, "
                     "compilation included, %.1f s)", " + ".join(str(len(ds)) for ds in sets.values()),
                     time.monotonic() - t0,
                     "the base with the adapters disabled" if recipe.method != "full" else "the model before step 1",
                     timing.get("first_row_seconds") or 0.0)
        if env.local_rank == 0 and (env.is_main or recipe.resolved.save_on_each_node):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{FILE}.{os.getpid()}.tmp")
            torch.save({"keys": keys, "values": values}, tmp)
            os.replace(tmp, path)
    for name, ds in sets.items():
        for item in ds.items:
            item.ref = (float(values[name][item.index, 0]), float(values[name][item.index, 1]))


def evaluate_pairs(recipe, step: int) -> float:
    """The DPO loss, rewards and accuracy on the evaluation pairs, logged as an {"event": "eval"} record."""
    sums = _pass(recipe, recipe.eval_ds, reference=False).tolist()
    pairs = max(sums[-1], 1.0)
    rec = {"event": "eval", "step": step, "eval_loss": sums[0] / pairs, "eval_pairs": int(sums[-1])}
    rec.update({f"eval_{k}": v / pairs for k, v in zip(STATS, sums[1:-1])})
    rec["eval_rewards_margin"] = rec["eval_rewards_chosen"] - rec["eval_rewards_rejected"]
    recipe.metrics.write(rec)
    log.info("eval at step %d: DPO loss %.4f, reward accuracy %.3f, margin %.4f over %d pairs", step,
             rec["eval_loss"], rec["eval_rewards_accuracy"], rec["eval_rewards_margin"], rec["eval_pairs"])
    return rec["eval_loss"]
