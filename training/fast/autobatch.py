"""The largest packed micro-batch that fits, and gradient checkpointing only when memory needs it.

Two probe micro-batches (forward and backward, no optimizer step, gradients dropped after) of
c1 and c2 tokens measure the peak memory; activation memory grows linearly in the tokens of a
micro-batch (attention is flash/varlen, linear too), so the two peaks give bytes per token and
the fixed part. A peak is the largest of several moments of the step, though, and in small rows a
moment that does not grow with the row can be the largest (FP8 full fine-tuning of a 1.5B model: rows
of 1,024 and 2,048 tokens peaked at 9.88 and 9.93 GiB, 0.06 MiB a token, where rows of 16,384 and
32,768 take 1.6 on an H200): the slope of two small rows then promises far longer rows than fit. So
where the plan reaches past the probes (confirm_size), one or two more probes nearer to it measure the
slope there, and the plan takes the steepest slope measured, through the largest probe
(plan_from_points). Adding the optimizer states that are not there yet (AdamW: two per trainable
parameter) gives the token budget that fills `fraction` of the device. The rows are the training
step's own (the loss module's probe_row: DPO probes rows of pairs through its DPO head and loss), and
the smallest is one sample of the longest allowed length (a record; DPO: a pair, two answers). If
not even that fits, gradient checkpointing is needed: the caller turns it on and probes again; it
does the same when rows would be short without it (worth_checkpointing). With compiled layers the
worker compiles them before probing, so the probes measure what training will use. A probe that runs
out of memory (caught where no rank waits on another inside a probe: without DeepSpeed or sequence
parallelism) says memory grows faster past the probes than they measured: the rows stay at the largest
probe that ran, after one more halfway to the one that did not; where even one record runs out, the
plan says it does not fit (then checkpointing, as above).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

log = logging.getLogger("training")


@dataclass
class Plan:
    tokens: int  # packed micro-batch budget (tokens per row)
    bytes_per_token: float
    fixed_bytes: float
    fits: bool  # at least one longest record fits
    ceiling: int | None = None  # the tokens of the smallest probe that ran out of memory (None: none did)


def plan_from_points(points: list[tuple[int, float]], total_bytes: float, extra_bytes: float, seq_len: int,
                     fraction: float = 0.85, max_tokens: int = 65536, multiple: int = 128) -> Plan:
    """Token budget from probe peaks [(tokens, bytes)], in increasing tokens: the steepest slope between
    neighbouring probes, drawn through the largest probe (memory that grows faster in longer rows is never
    extrapolated from the shorter ones)."""
    if len(points) < 2 or any(b[0] <= a[0] for a, b in zip(points, points[1:])):
        raise ValueError("the probes must be two or more, each larger than the one before")
    per_token = max(max((p2 - p1) / (c2 - c1) for (c1, p1), (c2, p2) in zip(points, points[1:])), 1.0)
    c_last, peak_last = points[-1]
    fixed = peak_last - per_token * c_last + extra_bytes
    room = fraction * total_bytes - fixed
    tokens = int(room // per_token) if room > 0 else 0
    tokens = min(tokens, max_tokens) // multiple * multiple
    fits = tokens >= seq_len
    return Plan(tokens=max(tokens, seq_len) if fits else 0, bytes_per_token=per_token, fixed_bytes=fixed, fits=fits)


CONFIRM_STEP = 8  # a confirming probe is at most this many times the largest before it
CONFIRM_GROWTH = 1.25  # and at least this many times it (closer probes read the allocator's rounding as a slope)
MAX_PROBES = 4


def confirm_size(plan: Plan, largest: int, seq_len: int, first: bool = True) -> int:
    """The tokens of one more probe where `plan` reaches past the largest probe so far (0: none), in whole records
    of seq_len tokens (the probe's rows hold whole records). The first is at half the plan (memory to spare where
    the slope of two small rows was far too shallow, as FP8's was), a later one at three quarters (the slope is
    then measured in long rows); either at most CONFIRM_STEP and at least CONFIRM_GROWTH times the largest."""
    if not plan.fits:
        return 0
    share = 0.5 if first else 0.75
    tokens = int(min(plan.tokens * share, CONFIRM_STEP * largest)) // seq_len * seq_len
    return tokens if tokens >= CONFIRM_GROWTH * largest else 0


def plan_by_probing(measure, seq_len: int, total_bytes: float, extra_bytes: float, fraction: float = 0.85,
                    max_tokens: int = 65536, agree=None) -> tuple[Plan, list[tuple[int, float]]]:
    """(plan, the probes that ran [(tokens, peak bytes)]): measure(tokens) -> the peak bytes of a forward and
    backward of a packed row of that many tokens, or None where it ran out of memory; two probes of one and two
    records, then confirming ones while the plan reaches past them (confirm_size), at most MAX_PROBES in all.
    After one that ran out of memory, the next is halfway to it, and the rows are at most the largest that ran.
    agree(tokens) -> the tokens every rank probes next (the largest any rank asks for: a probe is a collective step
    under ZeRO, every rank runs the same ones, and none is caught out of memory, so every rank probes alike);
    None: this rank alone."""
    points: list[tuple[int, float]] = []
    ceiling = None
    for c in (seq_len, 2 * seq_len):
        peak = measure(c)
        if peak is None:
            ceiling = c
            break
        points.append((c, peak))
    if not points:
        return Plan(tokens=0, bytes_per_token=0.0, fixed_bytes=0.0, fits=False, ceiling=ceiling), points
    if len(points) == 1:  # one record ran, two did not: a row of one, if the optimizer's states fit beside it
        fixed = points[0][1] + extra_bytes
        fits = fixed <= fraction * total_bytes
        return Plan(tokens=seq_len if fits else 0, bytes_per_token=0.0, fixed_bytes=fixed, fits=fits,
                    ceiling=ceiling), points
    plan = plan_from_points(points, total_bytes, extra_bytes, seq_len, fraction, max_tokens)
    probed = 2
    while probed < MAX_PROBES:
        largest = points[-1][0]
        if ceiling is None:
            more = confirm_size(plan, largest, seq_len, first=probed == 2)
        else:
            halfway = (largest + ceiling) // 2 // seq_len * seq_len
            more = halfway if halfway > largest else 0
        if agree is not None:
            more = agree(more)
        if more <= largest:
            break
        probed += 1
        peak = measure(more)
        if peak is None:
            ceiling = more
        else:
            points.append((more, peak))
            plan = plan_from_points(points, total_bytes, extra_bytes, seq_len, fraction, max_tokens)
    if ceiling is not None and plan.fits:
        # memory grew faster between the largest probe that ran and the one that did not than any slope measured
        top = max(points[-1][0] // 128 * 128, seq_len)
        plan = replace(plan, tokens=min(plan.tokens, top), ceiling=ceiling)
    return plan, points


# Rows shorter than this leave each micro-batch's fixed cost (ZeRO-3 gathers every weight and reduces every
# gradient per micro-batch, whatever its length) larger than checkpointing's recompute: 7B full fine-tuning under
# ZeRO-3 on one H200 trains 2,432-token rows without checkpointing at two thirds of the speed of 46,720-token rows
# with it (bench/README.md's train_speed results).
SHORT_ROW_TOKENS = 8192


def worth_checkpointing(without: Plan, with_: Plan | None = None) -> bool:
    """Whether to train with gradient checkpointing, from the probe without it (and, once measured, with it):
    when not even one record fits without it; or when rows would be short without it and checkpointing at
    least doubles them (its recompute costs about a third more compute). Called with `without` alone: whether
    a probe with checkpointing is worth making."""
    if not without.fits:
        return True
    if without.tokens >= SHORT_ROW_TOKENS:
        return False
    return with_ is None or (with_.fits and with_.tokens >= 2 * without.tokens)


def optimizer_state_bytes(model) -> int:
    """AdamW keeps two states per trainable parameter, in the parameter's dtype."""
    return sum(2 * p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def lazy_state_bytes(optimizer, params=None, count_host: bool = False) -> int:
    """The Adam states `optimizer` has not allocated yet for `params` (default: its own), on the device: torch's
    AdamW (and DeepSpeed's Adam) create exp_avg and exp_avg_sq at the first step, after the probes. Under
    DeepSpeed the params are the engine's flat fp32 partitions (ZeRO-3 hands them to the optimizer only inside
    its step, so the caller names them), so this counts what ZeRO keeps on this rank; an offloaded optimizer
    keeps them in host memory and counts nothing. For a full fine-tune of a 7B model that is 57 GiB the probes
    cannot see (an H200 ran out of memory at the first step without it). count_host: count host-memory params too
    (a CPU run's)."""
    if params is None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
    return sum(2 * p.numel() * p.element_size() for p in params
               if not optimizer.state.get(p) and (count_host or p.device.type != "cpu"))


def probe_plan(model, run_probe, device, seq_len: int, fraction: float = 0.85, max_tokens: int = 65536,
               states_built: bool = False, optimizer=None, optimizer_params=None, agree=None) -> Plan:
    """run_probe(tokens) runs one forward+backward of a packed row of that many tokens and drops the grads.
    states_built: the optimizer exists already (a DeepSpeed engine builds it with its fp32 partitions and
    gradient buffers), so the probes measure those; `optimizer` (the torch optimizer the engine steps) then says
    which Adam states are still to come for `optimizer_params` (lazy_state_bytes), added to the fixed part.
    agree: as plan_by_probing's; None where a probe waits on no other rank (no DeepSpeed engine, no sequence
    parallelism): only then is one that runs out of memory caught, and planned around on this rank."""
    import torch

    if states_built:
        # An engine allocates some buffers at its first backward (ZeRO-2's partitioned gradients, ZeRO-3's
        # reduce buckets): one unmeasured probe first, so they count as fixed, not as a cost per token.
        run_probe(seq_len)

    def measure(c: int) -> float | None:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            run_probe(c)
            ran = True
        except torch.cuda.OutOfMemoryError:
            if agree is not None:  # the other ranks wait inside this probe's collectives
                raise
            ran = False
        if not ran:  # outside the handler: its traceback no longer holds the probe's tensors
            model.zero_grad(set_to_none=True)  # what the backward had made before it ran out
            torch.cuda.empty_cache()
            log.info("auto micro-batch: a probe of %d tokens ran out of memory", c)
            return None
        torch.cuda.synchronize(device)
        return float(torch.cuda.max_memory_allocated(device))

    total = torch.cuda.get_device_properties(device).total_memory
    if states_built:
        extra = lazy_state_bytes(optimizer, optimizer_params) if optimizer is not None else 0
    else:
        extra = optimizer_state_bytes(model)
    plan, points = plan_by_probing(measure, seq_len, total, extra, fraction, max_tokens, agree)
    # The raw peaks behind the plan: what to read first when a run's rows look short for its memory.
    ran_out = f"; {plan.ceiling} tokens ran out of memory" if plan.ceiling else ""
    log.info("auto micro-batch probes: %s", ", ".join(
        f"{c} tokens -> {p / 2**30:.2f} GiB peak" for c, p in points) + ran_out + f"; optimizer states still to "
        f"come {extra / 2**30:.2f} GiB")
    return plan
