"""Step time and scaling, from a model's shape alone (pure; no torch); memory is estimate.py.

Step time (`estimate_step`, `scaling`)
======================================
- Model FLOPs per token (Kaplan et al. 2020; Chowdhery et al. 2022, PaLM,
  appendix B): forward 2*Pm + 4*L*s*q (Pm = parameters in matmuls, lm_head
  included; the attention term counts the causal half of 2 matmuls of s x q per
  token). Backward is 2x forward for full fine-tuning; with a frozen base it
  skips weight gradients, so 1x forward (Hu et al. 2021, LoRA); gradient
  checkpointing adds the decoder layers' forward again (the LM head sits outside
  the checkpoints).
- Compute time = tokens x FLOPs per token / (peak bf16 FLOP/s x efficiency). The
  efficiency (model FLOPs utilisation) depends on the worker's path unless given,
  each figure measured through the worker on one H200 (bench/train_speed.py; the
  test in tests/unit/test_estimate.py holds every current result within 15%):
  without DeepSpeed the fast path (packing, fused loss, compiled layers, cuDNN
  attention, LM head on supervised positions only) runs 7B LoRA and 1.5B full at
  0.52-0.57, so 0.53; under ZeRO-2 the same fast path runs inside the engine at
  0.95x plain DDP, so 0.51; under ZeRO-3, which gathers every layer's weights in
  forward and backward, 0.54 for full fine-tuning (1.5B runs at 0.49 and 7B with
  checkpointing at 0.60: the larger model's matmuls run faster; each within 15%)
  and 0.49 with a frozen base (7B LoRA, 0.95x plain DDP). Q-LoRA runs at 0.8x
  without DeepSpeed (4-bit dequantisation in every matmul: 0.83x LoRA's
  tokens/s) and at LoRA's speed under ZeRO-2 and ZeRO-3 (the engine's bf16
  adapters). A micro-batch never takes less than its host needs to issue it
  (estimate_comm.host_floor_s): tiny models are host-bound.
- FP8 (the worker's --fp8, `training.fp8`; fp8_decision decides as the worker does
  from the preset, the GPU type and its memory): through the worker on one H100
  (bench/results/fp8_worker-2026-12-05-H100*.md) 7B LoRA ran 1.10-1.12x of bf16
  in the rows its memory probe sized (8,192 tokens), 0.94x in rows of 4,096 and
  1.03x under ZeRO-2; full fine-tuning 0.80-1.05x; on one H200 with gradient
  checkpointing 7B LoRA ran 1.21x (-H200-ckpt.md), 1.17x on an H100 (counted:
  fp8_worker-2026-12-06-H100-ckpt.md). So auto runs FP8 for a LoRA
  base from the 7B hidden size on, without DeepSpeed, in rows of 8,192+ tokens;
  where FP8 runs on a dense model, compute time is divided by
  the ratio measured nearest its shape (FP8_RATIOS), for a mixture of experts by
  1 (not measured). Memory is counted as in bf16 (FP8 measured no higher).
- Communication (qwen_tui/plan/estimate_comm.py, sources there): bytes per collective after Rajbhandari et al.
  2020 (ZeRO, section 7): DDP all-reduces the gradients once per step (no_sync while accumulating); ZeRO-2
  reduce-scatters the bf16 gradients every micro-batch and all-gathers the updated weights once per step;
  ZeRO-3 all-gathers the weights (as stored: a 4-bit base packed) in forward, backward and the recompute and
  reduce-scatters the gradients, every micro-batch. LoRA reduces only the adapters' gradients. Time per
  collective is NCCL's latency (growing with the rank count) plus bytes over the bus bandwidth between nodes
  (its source named) or inside one; overlap hides what fits under compute except the last bucket, the first
  gather and every latency; the step waits for its slowest GPU.
- Scaling: weak scaling, micro-batch and accumulation per GPU fixed;
  efficiency(n) = tokens/s on n nodes / (n x tokens/s on 1 node).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from ..model.spec import ModelSpec
from .estimate import GPUS, QUANT_BYTES, RunShape

FAST_PATH_EFFICIENCY = 0.53  # the worker without DeepSpeed (measured, see the module doc)
# The worker under DeepSpeed, by ZeRO stage and by whether the base trains (measured, see the module doc).
ZERO_EFFICIENCY = {(1, True): 0.51, (1, False): 0.51, (2, True): 0.51, (2, False): 0.51,
                   (3, True): 0.54, (3, False): 0.49}
QLORA_EFFICIENCY_FACTOR = 0.8  # without DeepSpeed; under it Q-LoRA measured LoRA's speed (module doc)
# A mixture of experts runs its expert matmuls small and routed: the worker's MoE measurement (Qwen3-30B-A3B shape,
# LoRA, one H200, bench/results/moe_speed-2026-12-02-H200-*.json) ran at 31.8% MFU
# on active parameters against the dense path's 0.53: its step times take that ratio.
MOE_MEASURED_MFU = 0.318
MOE_EFFICIENCY_FACTOR = MOE_MEASURED_MFU / FAST_PATH_EFFICIENCY
CPU_ADAM_PARAMS_PER_S = 2e9  # DeepSpeed CPUAdam on one node's cores, order of magnitude
PCIE_GBS = 16.0  # host <-> GPU, GB/s, for offload



@dataclass
class StepEstimate:
    nodes: int
    gpus_per_node: int
    tokens_per_step: int  # all ranks, one optimizer step
    flops_per_token: float
    compute_s: float
    comm_bytes_per_gpu: float  # bytes each rank sends per optimizer step (algorithm bytes x ring factor)
    comm_s: float  # all communication, back to back (latency included)
    exposed_comm_s: float  # what overlap cannot hide (every collective's latency included)
    optimizer_s: float
    step_time_s: float  # with overlap
    step_time_no_overlap_s: float
    tokens_per_second: float
    bus_gbps: float  # bandwidth the collectives run at, Gbit/s
    strategy: str  # ddp | zero2 | zero3
    world_size: int = 1
    latency_s: float = 0.0  # collectives' latency per step (part of exposed_comm_s)
    interference_s: float = 0.0  # compute slowed by the collectives that run beside it
    link_known: bool = True  # False: several nodes and no bandwidth between them; the figures assume NVLink
    fp8: bool = False  # the matmuls run in FP8 (the worker's --fp8 on this GPU type)
    fp8_speedup: float = 1.0  # what compute time was divided by for it (under 1: FP8 measured slower)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ScalePoint:
    nodes: int
    step_time_s: float
    tokens_per_second: float
    scaling_efficiency: float
    step_time_no_overlap_s: float
    efficiency_no_overlap: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def flops_per_token(spec: ModelSpec, run: RunShape) -> float:
    """Training FLOPs per token: forward x (3 full, 2 LoRA) + the decoder layers' forward again with
    checkpointing. A mixture of experts counts the parameters a token runs (its k experts), not all of them."""
    fwd = 2 * spec.active_matmul_params + 4 * spec.layers * run.seq * spec.q_dim
    lora = run.method in ("lora", "qlora")
    if lora:
        fwd += 2 * spec.lora_params(run.lora_r, list(run.lora_targets), active=True)
    mult = 2.0 if lora else 3.0
    # Checkpointing recomputes the decoder layers' forward, not the LM head's (it sits outside the checkpoints).
    recompute = fwd - 2 * spec.vocab * spec.hidden if run.gradient_checkpointing else 0.0
    return fwd * mult + recompute


# FP8 against bf16 through the worker on one H100, tokens/s of its fast path with compiled layers and tensorwise
# scaling (bench/fp8_worker.py, results in FP8_RESULTS*): 7B LoRA on a frozen FP8 base 1.102x and 1.124x in the rows
# its memory probe sized (8,192-8,320 tokens), 0.941x in rows of 4,096, 1.034x under ZeRO-2; 1.5B full 0.980x in
# its probe's rows, 0.799x in rows of 8,192; the 7B layer shape in full under ZeRO-3 1.047x and 0.916x. On one H200
# with gradient checkpointing (its recomputed forward in FP8 too): 7B LoRA 1.208x and 1.211x in rows of 16,384
# (-H200-ckpt, and -probe-ckpt), on one H100 1.171x (FP8_MEASURED_CKPT: the figure counted, as every row here is an
# H100's), the 7B layer shape in full under ZeRO-3 1.082x (not counted: auto keeps bf16
# under DeepSpeed, whose all-gather stays bf16 and was measured on one GPU only). The worker's
# --fp8 auto (training/fast/fp8.py, whose AUTO_ON_FROM, AUTO_MIN_ROW and MEASURED tests/unit/test_fp8_plan.py holds
# equal to these) turns FP8 on for LoRA's frozen base from the 7B hidden size on, with or without checkpointing,
# without DeepSpeed, and, once its
# probe has sized the rows, only where a GPU's micro-batch holds 8,192 tokens or more. The estimate follows it; the
# rows it cannot know before the probe it takes from the memory model (fp8_row_tokens), which puts more memory on a
# token than the worker's fast path uses (8.9 MiB against 6.5 measured for 7B LoRA): where the model's rows fall
# short of 8,192 but a step could fill them, the estimate counts bf16 and says so, never a gain the run may not get.
# For an --fp8 on run of a dense model the step time takes the measured ratio nearest its shape (fp8_measured); a
# mixture of experts was not measured and counts 1. No ratio over 1 is counted that the worker did not measure.
FP8_AUTO_ON_FROM: dict[str, int] = {"lora": 3584}
FP8_AUTO_MIN_ROW = 8192
FP8_RESULTS = "bench/results/fp8_worker-2026-12-05-H100"
FP8_MEASURED = f"{FP8_RESULTS}-rows.md"
FP8_MEASURED_CKPT = "bench/results/fp8_worker-2026-12-06-H100-ckpt.md"
FP8_PAYS_AT = 1.05  # bench/fp8_speed.py's PAYS_AT: below it a gain is within call-to-call noise
FP8_MEMORY_FRACTION = 0.85  # the share of a GPU the worker's memory probe plans for (--auto_memory_fraction)
FP8_MAX_ROW = 65536  # the longest row it picks (--auto_max_tokens)


class Fp8Measured(NamedTuple):
    method: str  # "lora" (a frozen base) or "full"
    hidden: int  # the hidden size of the shape measured
    rows: int  # the tokens the FP8 arm's micro-batch held (its records a step in as few rows as held them)
    deepspeed: bool  # measured under DeepSpeed (ZeRO-2 or -3)
    ratio: float  # FP8's tokens/s over bf16's through the worker
    shape: str  # the shape measured, as the advice names it
    case: str  # bench/fp8_worker.py's case
    source: str  # the results file
    checkpointing: bool = False  # measured with gradient checkpointing


FP8_RATIOS = (
    Fp8Measured("lora", 3584, 8192, False, 1.102, "7B in rows of 8,192", "lora-7b-rows", FP8_MEASURED),
    Fp8Measured("lora", 3584, 4096, False, 0.941, "7B in rows of 4,096", "lora-7b", f"{FP8_RESULTS}.md"),
    Fp8Measured("lora", 3584, 8192, True, 1.034, "7B under ZeRO-2 in rows of 8,192", "lora-7b-zero2-rows",
                f"{FP8_RESULTS}-rows-zero2.md"),
    Fp8Measured("full", 1536, 8192, False, 0.799, "1.5B in rows of 8,192", "full-1.5b", f"{FP8_RESULTS}.md"),
    Fp8Measured("full", 1536, 32768, False, 0.980, "1.5B in rows of 32,768", "full-1.5b-rows",
                f"{FP8_RESULTS}-rows-full.md"),
    Fp8Measured("full", 3584, 4096, True, 0.916, "7B (ZeRO-3) in rows of 4,096", "full-7b-zero3",
                f"{FP8_RESULTS}-zero3.md"),
    Fp8Measured("full", 3584, 8192, True, 1.047, "7B (ZeRO-3) in rows of 8,192", "full-7b-zero3-rows",
                f"{FP8_RESULTS}-rows-full.md"),
    Fp8Measured("lora", 3584, 16384, False, 1.171,
                "7B with gradient checkpointing in rows of 16,384 (1.21x on an H200)",
                "lora-7b-ckpt-rows", FP8_MEASURED_CKPT, checkpointing=True),
)


def fp8_method(run: RunShape) -> str:
    """The rows of FP8_RATIOS and FP8_AUTO_ON_FROM a run reads: full, or lora for a frozen base."""
    return "full" if run.method == "full" else "lora"


def fp8_row_tokens(spec: ModelSpec, run: RunShape, gpu_gib: float | None, world: int = 1) -> tuple[int, int | None]:
    """(the most tokens a GPU's micro-batch can hold: a step's records packed, over the sequence-parallel group; the
    tokens it holds in the rows the memory model sizes as the worker's probe would, at most FP8_MAX_ROW, None with
    no GPU memory given). A step's records fill as few rows as hold them (training.fast.fp8.row_tokens). world:
    the GPUs ZeRO shards over."""
    from .estimate import max_micro_batch

    sp = max(1, run.sequence_parallel)
    step = run.seq * run.micro_batch * run.grad_accum * run.sequences
    bound = step // sp
    if gpu_gib is None:
        return bound, None
    unit = 1024  # rows counted in records of 1,024 tokens, as the probe's two rows are
    capacity = unit * max_micro_batch(spec, run, world, gpu_gib * FP8_MEMORY_FRACTION, limit=FP8_MAX_ROW // unit,
                                      seq=unit, grad_accum=1, gradient_checkpointing=run.gradient_checkpointing)
    if capacity <= 0:
        return bound, 0
    rows = -(-step // capacity)
    return bound, int(min(step / rows, capacity)) // sp


class Fp8Decision(NamedTuple):
    on: bool  # the worker runs this run's matmuls in FP8
    why: str
    speedup: float  # what compute time is divided by (1: no change counted)
    measured: Fp8Measured | None  # the measurement counted, where FP8 runs on a dense model


def fp8_decision(spec: ModelSpec, run: RunShape, fp8_gpu: bool | None, gpu_gib: float | None = None,
                 world: int = 1) -> Fp8Decision:
    """What the worker's --fp8 does with this run, as it decides from the preset and the GPU type (fp8_gpu: FP8
    tensor cores, None: unknown; gpu_gib: its memory, for the rows), and the ratio the step time counts. Where `on`
    cannot run it is not run: the advice says so. The rows are sized once (the memory model's search)."""
    on, why, row = _fp8_runs(spec, run, fp8_gpu, gpu_gib, world)
    if not on or spec.is_moe:
        return Fp8Decision(on, why, 1.0, None)
    if row is None:  # `on` as set: auto's checks, which size the rows, did not run
        bound, modelled = fp8_row_tokens(spec, run, gpu_gib, world)
        row = modelled if modelled is not None else bound
    m = fp8_measured(spec, run, row)
    # A gain is counted only at or above the size and the rows it was measured at, with gradient checkpointing as
    # it was measured (on or off), and only one past the measurements' noise (FP8_PAYS_AT).
    gain = m.ratio > 1.0 and not (m.ratio < FP8_PAYS_AT or spec.hidden < m.hidden or row < m.rows
                                  or bool(run.gradient_checkpointing) != m.checkpointing)
    return Fp8Decision(on, why, m.ratio if m.ratio <= 1.0 or gain else 1.0, m)


def _fp8_runs(spec: ModelSpec, run: RunShape, fp8_gpu: bool | None, gpu_gib: float | None,
              world: int) -> tuple[bool, str, int | None]:
    """(on, why, the rows a GPU's micro-batch holds where auto sized them, else None) of fp8_decision."""
    if run.fp8 == "off":
        return False, "off as set", None
    if run.method == "qlora":
        return False, "Q-LoRA's 4-bit base has no FP8 matmul", None
    if run.precision != "bf16":
        return False, "FP8 needs bf16 precision", None
    if not fp8_gpu:
        return False, "the GPU type is unknown" if fp8_gpu is None else "the GPU has no FP8 tensor cores", None
    if run.fp8 == "on":
        return True, "on as set", None
    if spec.is_moe:
        return False, "auto: not measured on a mixture of experts", None
    if not run.compiled:
        return False, "auto: measured with compiled layers only (extra_args say --no_compile)", None
    smallest = FP8_AUTO_ON_FROM.get(fp8_method(run))
    if smallest is None:
        return False, "auto: full fine-tuning measured no faster through the worker (1.5B 0.98x, 7B ZeRO-3 1.05x)", \
            None
    if run.zero_stage is not None:
        return False, "auto: under DeepSpeed FP8 measured within noise of bf16 (7B LoRA under ZeRO-2 1.03x)", \
            None
    if spec.hidden < smallest:
        return False, f"auto: hidden size {spec.hidden} is under {smallest}, the smallest measured faster", None
    bound, modelled = fp8_row_tokens(spec, run, gpu_gib, world)
    row = modelled if modelled is not None else bound
    if bound < FP8_AUTO_MIN_ROW:
        return False, (f"auto: a GPU's micro-batch holds at most {bound:,} tokens (a step's records), under the "
                       f"{FP8_AUTO_MIN_ROW:,} FP8 was measured faster from"), None
    if modelled == 0:
        return False, ("auto: by the memory model not even a 1,024-token row fits this GPU without gradient "
                       "checkpointing; the worker then turns it on and runs FP8 where its rows hold 8,192 tokens "
                       "(its log says), so the estimate counts bf16, not a gain the run may not get"), None
    if modelled is not None and modelled < FP8_AUTO_MIN_ROW:
        return False, (f"auto: the memory model puts this GPU's rows at about {modelled:,} tokens, under "
                       f"{FP8_AUTO_MIN_ROW:,}; the worker's memory probe may size them longer and then runs FP8 "
                       "(its log says), so the estimate counts bf16, not a gain the run may not get"), None
    return True, f"auto: hidden size {spec.hidden} without DeepSpeed, in rows of 8,192+ tokens, measured faster", \
        row


def fp8_runs(spec: ModelSpec, run: RunShape, fp8_gpu: bool | None, gpu_gib: float | None = None,
             world: int = 1) -> tuple[bool, str]:
    """(the worker runs this run's matmuls in FP8, why): fp8_decision's."""
    return _fp8_runs(spec, run, fp8_gpu, gpu_gib, world)[:2]


def fp8_measured(spec: ModelSpec, run: RunShape, row: int) -> Fp8Measured:
    """The measurement an FP8 run of this shape, in rows of `row` tokens a GPU, is counted at: its method's, under
    DeepSpeed or not and with gradient checkpointing or not as the run is (either, where that was not measured),
    at the largest measured hidden size not
    above the model's (else the smallest), in the longest measured rows not above the run's (else the shortest)."""
    mine = [r for r in FP8_RATIOS if r.method == fp8_method(run)]
    ds = run.zero_stage is not None
    mine = [r for r in mine if r.deepspeed == ds] or mine
    mine = [r for r in mine if r.checkpointing == bool(run.gradient_checkpointing)] or mine
    hiddens = sorted({r.hidden for r in mine})
    hidden = next((h for h in reversed(hiddens) if h <= spec.hidden), hiddens[0])
    at = sorted((r for r in mine if r.hidden == hidden), key=lambda r: r.rows)
    return next((r for r in reversed(at) if r.rows <= row), at[0])


def path_efficiency(run: RunShape) -> float:
    """The worker's measured model FLOPs utilisation on its path: plain DDP, or DeepSpeed's ZeRO stage with a
    trained (full) or frozen (LoRA, Q-LoRA) base."""
    if run.zero_stage is None:
        return FAST_PATH_EFFICIENCY
    return ZERO_EFFICIENCY.get((min(max(int(run.zero_stage), 1), 3), run.method == "full"), ZERO_EFFICIENCY[(2, True)])


def effective_efficiency(run: RunShape, efficiency: float | None = None,
                         spec: ModelSpec | None = None) -> float:
    """What compute time is divided by: the given efficiency (else the path's, a mixture of experts' as measured),
    times Q-LoRA's factor."""
    base = path_efficiency(run) if efficiency is None else efficiency
    if efficiency is None and spec is not None and spec.is_moe:
        base *= MOE_EFFICIENCY_FACTOR
    return base * (QLORA_EFFICIENCY_FACTOR if run.method == "qlora" and run.zero_stage is None else 1.0)


def estimate_step(spec: ModelSpec, training: Any, nodes: int, gpus_per_node: int,
                  bandwidth_gbps: float | None, gpu_tflops: float = GPUS["H100"].bf16_tflops,
                  efficiency: float | None = None, intra_node_gbs: float = GPUS["H100"].intra_node_gbs,
                  hbm_gbs: float = GPUS["H100"].hbm_gbs, world_size: int | None = None,
                  fp8_gpu: bool | None = False, gpu_gib: float | None = GPUS["H100"].memory_gib,
                  **overrides: Any) -> StepEstimate:
    """Predicted optimizer-step time on `nodes` x `gpus_per_node` GPUs; formulas in the module docstring and in
    estimate_comm's.

    bandwidth_gbps: per-node all-reduce bus bandwidth between nodes, Gbit/s (estimate_comm.resolve_bandwidth).
    None with several nodes: unknown; the figures then take the link as fast as inside a node and say so
    (`link_known` False): a caller shows them as unknown.
    intra_node_gbs: NCCL bus bandwidth inside a node, GB/s (the GPU table's, or the node's measured topology).
    world_size: the real number of GPUs when nodes differ (2 + 1 GPUs: 3); default nodes x gpus_per_node.
    efficiency: model FLOPs utilisation of bf16 matmuls (None: the worker path's, see path_efficiency).
    fp8_gpu: the GPU has FP8 tensor cores (None: unknown): where the worker's --fp8 runs FP8, compute time is divided
    by the worker's measured FP8/bf16 ratio (fp8_decision's speedup; under 1: FP8 measured slower). gpu_gib: a GPU's memory,
    for the rows FP8's auto looks at (None: unknown).
    """
    from .estimate_comm import host_floor_s, intra_kind, slowest_gpu_factor, step_comm

    run = RunShape.of(training, **overrides)
    nodes, g = max(1, nodes), max(1, gpus_per_node)
    world = max(1, int(world_size)) if world_size else nodes * g
    nodes = min(nodes, world)
    lora = run.method in ("lora", "qlora")
    P = spec.total_params
    Pt = spec.lora_params(run.lora_r, list(run.lora_targets)) if lora else P
    eff = effective_efficiency(run, efficiency, spec)
    fpt = flops_per_token(spec, run)
    fp8 = fp8_decision(spec, run, fp8_gpu, gpu_gib, world)
    fp8_on, fp8_x = fp8.on, fp8.speedup
    micro_compute = max(run.tokens * fpt / (gpu_tflops * 1e12 * eff * fp8_x), host_floor_s(spec.layers))
    micro_compute *= slowest_gpu_factor(world_size or nodes * g)  # the step waits for its slowest GPU
    compute = micro_compute * run.grad_accum
    passes = (2 if lora else 3) + (1 if run.gradient_checkpointing else 0)  # in units of one forward
    fwd_window = micro_compute / passes
    bwd_window = micro_compute - fwd_window  # backward (with its recompute) follows one forward

    intra = intra_node_gbs * 8  # Gbit/s
    link_known = nodes == 1 or bool(bandwidth_gbps)
    bus = intra if nodes == 1 or not bandwidth_gbps else min(intra, bandwidth_gbps)
    ds = run.zero_stage is not None and run.half
    strategy = "ddp" if not ds else f"zero{run.zero_stage}"
    gb = 2 if run.half else 4
    if not ds and lora:
        gb = 4  # peft keeps adapters (and their gradients) in fp32
    elif not ds and run.master_fp32 is not False:
        gb = 4
    if strategy == "zero3":
        # ZeRO-3 gathers every weight as the module stores it: a 4-bit base at its packed size (QUANT_BYTES) with
        # the rest in the run's half dtype; a bf16 base at 2 bytes.
        if run.method == "qlora":
            quantized = spec.layers * spec.layer_linear_params
            weight_bytes = quantized * QUANT_BYTES.get(spec.quant_bits or 4, 0.52) + (P - quantized) * 2 + 2 * Pt
            layer_bytes = spec.layer_linear_params * QUANT_BYTES.get(spec.quant_bits or 4, 0.52)
        else:
            weight_bytes = 2 * (P + (Pt if lora else 0))
            layer_bytes = 2 * spec.layer_params
    else:
        weight_bytes, layer_bytes = 2 * Pt, 0.0
    gathers = (3 if run.gradient_checkpointing else 2) if strategy == "zero3" else 0
    cm = step_comm(strategy, world=world, nodes=nodes, bus_Bps=bus * 1e9 / 8, intra=intra_kind(intra_node_gbs),
                   grad_accum=run.grad_accum, layers=spec.layers, grad_bytes=Pt * gb, param_bytes=weight_bytes,
                   layer_param_bytes=layer_bytes, gathers_per_micro=gathers, fwd_window=fwd_window,
                   bwd_window=bwd_window)

    # AdamW touches param, grad, m, v (read + write, fp32): 32 bytes per trainable parameter of this rank. Without
    # ZeRO every rank steps all of them: that part does not shrink with more GPUs.
    shard = Pt / world if ds else Pt
    opt = shard * 32 / (hbm_gbs * 1e9)
    if ds and run.offload != "none":
        opt = shard * g / CPU_ADAM_PARAMS_PER_S + shard * 4 / (PCIE_GBS * 1e9)
        if run.offload == "all" and run.zero_stage == 3:
            opt += run.grad_accum * (2 if run.gradient_checkpointing else 1) * 2 * P / world * 2 / (PCIE_GBS * 1e9)
    step = compute + cm.exposed_s + cm.interference_s + opt
    step_no = compute + cm.total_s + opt
    tokens = run.tokens * run.grad_accum * world
    return StepEstimate(
        nodes=nodes, gpus_per_node=g, tokens_per_step=tokens, flops_per_token=fpt, compute_s=compute,
        comm_bytes_per_gpu=cm.bytes_per_gpu, comm_s=cm.total_s, exposed_comm_s=cm.exposed_s, optimizer_s=opt,
        step_time_s=step, step_time_no_overlap_s=step_no, tokens_per_second=tokens / step,
        bus_gbps=bus, strategy=strategy, world_size=world, latency_s=cm.latency_s,
        interference_s=cm.interference_s, link_known=link_known, fp8=fp8_on, fp8_speedup=fp8_x,
    )


def scaling(spec: ModelSpec, training: Any, max_nodes: int, gpus_per_node: int, bandwidth_gbps: float | None,
            **kwargs: Any) -> list[ScalePoint]:
    """Predicted step time, tokens/s and weak-scaling efficiency for 1..max_nodes nodes."""
    out: list[ScalePoint] = []
    base = base_no = 0.0  # one node's tokens/s, with and without overlap: what the others are measured against
    for n in range(1, max(1, max_nodes) + 1):
        s = estimate_step(spec, training, n, gpus_per_node, bandwidth_gbps, **kwargs)
        tps_no = s.tokens_per_step / s.step_time_no_overlap_s
        if n == 1:
            base, base_no = s.tokens_per_second, tps_no
        # Never above 1: with the optimizer on the host (offload) one node steps all of it on its own CPUs, and n
        # nodes 1/n each, which reads as more than n times one node's speed: the nodes' CPUs added, not a scaling
        # of the GPUs' work, and a one-node run of a model that needs offload rarely fits anyway.
        out.append(ScalePoint(nodes=n, step_time_s=s.step_time_s, tokens_per_second=s.tokens_per_second,
                              scaling_efficiency=min(1.0, s.tokens_per_second / (n * base)),
                              step_time_no_overlap_s=s.step_time_no_overlap_s,
                              efficiency_no_overlap=min(1.0, tps_no / (n * base_no))))
    return out


WORTH_SHARE = 0.5  # a node is worth adding while its GPUs add at least half of what each GPU does alone


def nodes_worth_it(spec: ModelSpec, training: Any, gpus_per_node: int, bandwidth_gbps: float | None,
                   limit: int = 64, **kwargs: Any) -> int | None:
    """The node count past which one more node adds less than WORTH_SHARE of a node's worth of tokens/s (its GPUs
    at half their one-node speed), up to `limit` (returned when every node up to it is worth it). None when the
    link between nodes is unknown."""
    if not bandwidth_gbps:
        return None
    one = prev = estimate_step(spec, training, 1, gpus_per_node, bandwidth_gbps, **kwargs).tokens_per_second
    for n in range(2, limit + 1):
        tps = estimate_step(spec, training, n, gpus_per_node, bandwidth_gbps, **kwargs).tokens_per_second
        if tps - prev < WORTH_SHARE * one:
            return n - 1
        prev = tps
    return limit
