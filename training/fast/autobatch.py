"""The largest packed micro-batch that fits, and gradient checkpointing only when memory needs it.

Two probe micro-batches (forward and backward, no optimizer step, gradients dropped after) of
c1 and c2 tokens measure the peak memory; activation memory grows linearly in the tokens of a
micro-batch (attention is flash/varlen, linear too), so the two peaks give bytes per token and
the fixed part. Adding the optimizer states that are not there yet (AdamW: two per trainable
parameter) gives the token budget that fills `fraction` of the device. If not even one record
of the longest allowed length fits, gradient checkpointing is needed: the caller turns it on
and probes again. With compiled layers the worker compiles them before probing, so the probes measure
what training will use.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Plan:
    tokens: int  # packed micro-batch budget (tokens per row)
    bytes_per_token: float
    fixed_bytes: float
    fits: bool  # at least one longest record fits


def plan_from_probes(c1: int, peak1: float, c2: int, peak2: float, total_bytes: float, extra_bytes: float,
                     seq_len: int, fraction: float = 0.85, max_tokens: int = 65536, multiple: int = 128) -> Plan:
    """Token budget from two probe peaks (bytes at c1 and c2 tokens); a multiple of `multiple`, at most
    max_tokens, at least seq_len when it fits at all."""
    if c2 <= c1:
        raise ValueError("the second probe must be larger than the first")
    per_token = max((peak2 - peak1) / (c2 - c1), 1.0)
    fixed = peak1 - per_token * c1 + extra_bytes
    room = fraction * total_bytes - fixed
    tokens = int(room // per_token) if room > 0 else 0
    tokens = min(tokens, max_tokens) // multiple * multiple
    fits = tokens >= seq_len
    return Plan(tokens=max(tokens, seq_len) if fits else 0, bytes_per_token=per_token, fixed_bytes=fixed, fits=fits)


def optimizer_state_bytes(model) -> int:
    """AdamW keeps two states per trainable parameter, in the parameter's dtype."""
    return sum(2 * p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def probe_plan(model, run_probe, device, seq_len: int, fraction: float = 0.85, max_tokens: int = 65536,
               states_built: bool = False) -> Plan:
    """run_probe(tokens) runs one forward+backward of a packed row of that many tokens and drops the grads.
    states_built: the optimizer's states exist already (a DeepSpeed engine builds them), so the probes measure
    them and nothing is added for them."""
    import torch

    peaks = []
    sizes = (seq_len, 2 * seq_len)
    if states_built:
        # An engine allocates some buffers at its first backward (ZeRO-2's partitioned gradients, ZeRO-3's
        # reduce buckets): one unmeasured probe first, so they count as fixed, not as a cost per token.
        run_probe(seq_len)
    for c in sizes:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        run_probe(c)
        torch.cuda.synchronize(device)
        peaks.append(torch.cuda.max_memory_allocated(device))
    total = torch.cuda.get_device_properties(device).total_memory
    extra = 0 if states_built else optimizer_state_bytes(model)
    return plan_from_probes(sizes[0], peaks[0], sizes[1], peaks[1], total, extra, seq_len, fraction, max_tokens)
