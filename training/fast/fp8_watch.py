"""The proof that FP8 ran, and that it trains what bf16 would, from inside the run (training.fast.fp8 converts).

Users of other trainers report FP8 switches that silently did nothing, or ran slower. So a run with FP8 on:

- profiles one early step (PROFILE_STEP: the first that runs the compiled graphs as training will) with
  torch.profiler and counts its FP8 matmuls: aten::_scaled_mm calls, and on CUDA the GEMM kernels they launched
  (cuBLAS's FP8 kernels, `nvjet_sm90_qqtst_*` / `_qrtst_*` on Hopper, or any name that says e4m3, e5m2, fp8 or
  f8f8; Inductor's fused casts carry `_scaled_mm` in their names too and are left out: they are not matmuls).
  The count goes to the log and to metrics.jsonl (an fp8_profile event); none at all is a warning record
  (FP8_NOT_ENGAGED) and a loud line;
- guards the loss over its first steps (--fp8_guard_steps): the step's first micro-batch also runs a no-grad
  forward with the FP8 layers in bf16 (Fp8Layers.bf16_matmuls: the same weights, the same batch, eager), from the
  same random state as the training forward (so LoRA's dropout draws the same masks), and the two losses are
  compared (under DPO, the answers' log-likelihoods: measure()): |FP8 - bf16| / |bf16| must stay within
  --fp8_parity_bound on every rank. One fp8_guard record a step.
  Past it, `auto` turns FP8 off for the rest of the run (the layers back to nn.Linear; the compiled layers
  compile again once, in bf16) with an FP8_PARITY warning record; `on` stops the run with an error that says so.

Why this guard: comparing the training forward's own loss against bf16 on the same weights and batch isolates
FP8's rounding from everything else (two separate runs drift apart by their updates, and take twice the GPU),
costs one forward of one micro-batch a guarded step, and leaves the run's random numbers and updates untouched
(the reference runs under a forked RNG and no_grad). Measured at the same weights, FP8 moved the loss by
0.13-0.45% on the 7B and 1.5B shapes (bench/results/fp8_speed-2026-12-05-H200.md, step 1 of each case), so the
default bound of 2% catches an FP8 that is broken (overflowing scales, a wrong cast), not its normal rounding.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from typing import Any

import torch

from training.fast.fp8 import ZERO3_NOTE, Fp8Layers
from training.runtime import dist
from training.runtime.errors import ExplainedFailure

log = logging.getLogger("training")

PROFILE_STEP = 2  # step 1 compiles (its profile would count the tracing too); step 2 runs as training does
FP8_OPS = ("aten::_scaled_mm", "aten::_scaled_mm_v2")
FP8_GEMM = re.compile(r"e4m3|e5m2|fp8|f8f8|_f8_|qqtst|qrtst|float8", re.IGNORECASE)


def measure(out) -> torch.Tensor:
    """What the guard compares of a micro-batch's StepLoss: its loss; under DPO its answers' summed negative
    log-probabilities, since DPO's loss is a difference against the reference pass's log-probabilities, which were
    computed in FP8 before the first step (comparing it would weigh that pass's rounding, not this forward's)."""
    if getattr(out, "pref_sums", None) is not None:
        return -(out.pref_sums[3] + out.pref_sums[4]).detach().float()  # STATS' logps_chosen, logps_rejected
    return out.ce.detach().float()


class Fp8ParityError(ExplainedFailure):
    """--fp8 on, and the FP8 loss left bf16's by more than --fp8_parity_bound."""


def count_fp8(prof, cuda: bool) -> dict:
    """The FP8 matmuls a stopped profiler saw: aten::_scaled_mm calls, and on CUDA the FP8 GEMM kernels (launches,
    GPU milliseconds, the busiest names)."""
    out: dict[str, Any] = {"fp8_matmuls": 0, "fp8_gemm_kernels": 0, "fp8_gemm_ms": 0.0, "kernels": []}
    kernels = []
    for e in prof.key_averages():
        if e.key in FP8_OPS:
            out["fp8_matmuls"] += int(e.count)
        if not cuda or "cuda" not in str(getattr(e, "device_type", "")).lower():
            continue
        if FP8_GEMM.search(e.key) and not e.key.startswith("triton_"):  # Inductor's casts are not matmuls
            us = float(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0) or 0.0)
            out["fp8_gemm_kernels"] += int(e.count)
            kernels.append({"name": e.key[:120], "launches": int(e.count), "gpu_ms": round(us / 1e3, 3)})
    out["fp8_gemm_ms"] = round(sum(k["gpu_ms"] for k in kernels), 3)
    out["kernels"] = sorted(kernels, key=lambda k: -k["gpu_ms"])[:5]
    return out


class Fp8Watch:
    """The step loop's side of FP8. layers: what was converted; mode: --fp8 as given (auto or on); reference:
    (batch, num_items, num_tokens) -> the micro-batch's loss of an evaluation forward (no DDP, no gradients);
    write: metrics.jsonl's writer (rank 0's; the others' writes go nowhere)."""

    def __init__(self, layers: Fp8Layers, *, mode: str, reference: Callable, device: torch.device, guard_steps: int,
                 bound: float, start_step: int, total_steps: int, write: Callable[[dict], None],
                 is_main: bool, method: str, compiled: bool):
        self.layers, self.mode, self._reference = layers, mode, reference
        self.device, self.bound, self.write, self.is_main, self.method = device, bound, write, is_main, method
        self.compiled = compiled
        self.guard_until = start_step + guard_steps  # the steps after start_step up to this one are guarded
        first = start_step + PROFILE_STEP
        self.profile_step = first if first <= total_steps else (start_step + 1 if total_steps > start_step else None)
        self.engaged: bool | None = None  # what the profiled step showed
        self.turned_off_at: int | None = None

    @property
    def active(self) -> bool:
        return self.layers.active

    # ------------------------------------------------------------------ the guard
    def reference(self, step: int, batch: dict, num_items, num_tokens) -> torch.Tensor | None:
        """Before the first micro-batch's training forward of a guarded step: its loss with bf16 matmuls."""
        if not self.active or step > self.guard_until:
            return None
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices), self.layers.bf16_matmuls():
            out = self._reference(batch, num_items, num_tokens)
        return measure(out)

    def check(self, step: int, ref: torch.Tensor, out) -> None:
        """After that forward (its StepLoss `out`): compares, on every rank at once (any rank past the bound is
        every rank's)."""
        b, f = float(ref.item()), float(measure(out).item())
        rel = abs(f - b) / abs(b) if abs(b) > 1e-12 else abs(f - b)
        bad = not (math.isfinite(f) and rel <= self.bound) and math.isfinite(b)
        worst = dist.all_reduce_max(torch.tensor([float(bad), rel if math.isfinite(rel) else 1e30],
                                                 dtype=torch.float64, device=self.device)).tolist()
        bad, worst_rel = bool(worst[0]), float(worst[1])
        self.write({"event": "fp8_guard", "step": step, "bf16_loss": b, "fp8_loss": f, "rel_diff": rel,
                    "worst_rel_diff": worst_rel, "bound": self.bound, "ok": not bad,
                    "measure": "answers' negative log-likelihood" if out.pref_sums is not None else "loss"})
        if not bad:
            if self.is_main:
                log.info("FP8 loss guard, step %d: FP8 %.5f, bf16 %.5f (%.3f%%; worst rank %.3f%%, bound %.2f%%)",
                         step, f, b, 100 * rel, 100 * worst_rel, 100 * self.bound)
            return
        what = (f"FP8 loss parity failed at step {step}: FP8 {f:.5f} against bf16 {b:.5f} on the same batch and "
                f"weights ({100 * worst_rel:.2f}% on the worst rank, bound {100 * self.bound:.2f}%, "
                "--fp8_parity_bound)")
        if self.mode == "on":
            raise Fp8ParityError(what + "; --fp8 on stops here: rerun with --fp8 off (or --fp8 auto, which goes "
                                 "back to bf16 on its own)")
        self.layers.restore()
        self.turned_off_at = step
        msg = what + "; --fp8 auto turns FP8 off for the rest of the run (the compiled layers compile again, in bf16)"
        self.write({"event": "warning", "code": "FP8_PARITY", "step": step, "message": msg})
        log.warning("%s", msg)

    # ------------------------------------------------------------------ the profiled step
    def profiled(self, step: int, prof, micro_batches: int) -> None:
        """The profiled step's FP8 matmuls, logged and recorded; a loud warning when FP8 is on and none ran."""
        cuda = self.device.type == "cuda"
        seen = count_fp8(prof, cuda)
        # forward, input gradient, weight gradient; a frozen base's weight gradient is compiled away (eager, torchao
        # computes it and autograd drops it)
        per = 2 if self.method != "full" and self.compiled else 3
        expected = self.layers.converted * per * max(micro_batches, 1)
        self.engaged = bool(seen["fp8_matmuls"] or seen["fp8_gemm_kernels"])
        rec = {"event": "fp8_profile", "step": step, **seen, "converted": self.layers.converted,
               "micro_batches": micro_batches, "expected_about": expected, "engaged": self.engaged,
               "active": self.active}
        self.write(rec)
        if not self.active:
            log.info("FP8 profile of step %d: FP8 was turned off at step %s by the loss guard", step,
                     self.turned_off_at)
            return
        gemm = (f", {seen['fp8_gemm_kernels']} FP8 GEMM kernel launches ({seen['fp8_gemm_ms']:.1f} ms)"
                if cuda else "")
        if self.engaged:
            log.info("FP8 engaged: step %d ran %d FP8 matmuls (aten::_scaled_mm; about %d expected: %d layers x %d "
                     "x %d micro-batches)%s", step, seen["fp8_matmuls"], expected, self.layers.converted, per,
                     micro_batches, gemm)
            return
        msg = (f"FP8 is on ({self.layers.converted} layers converted) but the profiled step {step} ran no FP8 "
               "matmul (no aten::_scaled_mm, no FP8 GEMM kernel): the run trains in bf16 at bf16's speed")
        self.write({"event": "warning", "code": "FP8_NOT_ENGAGED", "step": step, "message": msg})
        log.warning("!!! %s !!!", msg)


def conversion_record(layers: Fp8Layers, mode: str, why: str, zero_stage: int, guard_steps: int, bound: float,
                      profile_step: int | None) -> dict:
    """metrics.jsonl's fp8 event: what was converted and how the run will prove it."""
    return {"event": "fp8", "mode": mode, "why": why, **layers.record(),
            "zero3_all_gather": "bf16" if zero_stage == 3 else None, "guard_steps": guard_steps,
            "parity_bound": bound, "profile_step": profile_step}


def log_conversion(layers: Fp8Layers, zero_stage: int) -> None:
    log.info("%s", layers.summary())
    if zero_stage == 3:
        log.info("%s", ZERO3_NOTE)
