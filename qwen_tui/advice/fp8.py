"""Advice for FP8 (training.fp8: the worker's --fp8, torchao's float8 matmuls), with what was measured through the
worker (bench/results/fp8_worker-2026-12-05-H100*.md: faster than bf16 only for a 7B-class LoRA base without
DeepSpeed in rows of 8,192+ tokens, where auto runs it; within noise or slower on every other shape measured).

FP8_CANNOT_RUN   training.fp8 is on where the worker refuses it at set-up: Q-LoRA, a precision other than bf16,
                 CPU processes, a GPU type without FP8 tensor cores, or a node whose probe found no torchao
FP8_UNMEASURED   training.fp8 is on for a mixture of experts, where FP8 was not measured at all: the estimate counts
                 no change, and it may run slower
FP8_TORCHAO      auto would run FP8 here, but a node has no torchao: every node stays bf16 (the ranks run the same
                 matmuls or none in FP8). Silent where auto would keep bf16 anyway
FP8_ON           FP8 runs on this preset: what converts, the ratio measured through the worker that the estimate
                 counts (a warning where it measured slower than bf16), and how the run proves it
"""

from __future__ import annotations

from collections.abc import Iterable

from ..base.levels import Level
from ..plan.estimate import RunShape
from ..plan.estimate_time import FP8_MEASURED, fp8_decision, fp8_method, fp8_runs
from .core import Advice, Context, Fix, rule

AUTO = Fix("FP8 auto (only where measured faster)", {"training.fp8": "auto"})
TORCHAO_HINT = "pip install torchao (or qwen-tui's [gpu] extra) into the Python of node {node}"


def _run(c: Context) -> RunShape:
    return RunShape.of(c.t)  # extra_args' --fp8 wins over training.fp8, as in the worker's argv


@rule
def fp8_cannot_run(c: Context) -> Iterable[Advice]:
    run = _run(c)
    if run.fp8 != "on":
        return
    missing = c.torchao_missing()
    if run.method == "qlora":
        why, fix = "Q-LoRA's 4-bit base dequantizes to bf16 for every matmul: there is no FP8 matmul to run", AUTO
    elif run.precision != "bf16":
        why, fix = (f"FP8 matmuls take bf16 activations, and precision is {run.precision}",
                    Fix("bf16 precision", {"training.precision": "bf16"}))
    elif c.cpu:
        why, fix = "the run is on CPU processes (FP8 needs an NVIDIA GPU of compute capability 8.9 or newer)", AUTO
    elif c.gpu is not None and c.gpu.fp8 is False:
        why, fix = (f"{c.gpu.name} has no FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper, "
                    "Blackwell)", AUTO)
    elif missing:
        why = f"torchao is not installed on node(s) {', '.join(map(str, missing))}"
        fix = Fix("Install torchao", hint=TORCHAO_HINT.format(node=missing[0]))
    else:
        return
    yield Advice(Level.ERROR, "FP8_CANNOT_RUN", f"training.fp8 is on, but {why}: the worker refuses it at set-up",
                 fix)


@rule
def fp8_unmeasured(c: Context) -> Iterable[Advice]:
    run = _run(c)
    if run.fp8 != "on" or c.spec is None or not c.spec.is_moe or not fp8_runs(c.spec, run, c.fp8_gpu)[0]:
        return
    yield Advice(Level.WARNING, "FP8_UNMEASURED",
                 "training.fp8 is on for a mixture of experts, where FP8 was not measured (its experts are not linear "
                 "layers torchao converts): the estimate counts no change, and it "
                 f"may run slower, as every shape measured through the worker did ({FP8_MEASURED})", AUTO)


@rule
def fp8_torchao(c: Context) -> Iterable[Advice]:
    run = _run(c)
    missing = c.torchao_missing()
    if run.fp8 != "auto" or not missing or c.spec is None or c.gpu is None or not c.gpu.fp8:
        return
    if not fp8_runs(c.spec, run, True, c.gpu.memory_gib, c.preset.world_size)[0]:
        return  # auto would keep this run in bf16 anyway
    gpu_nodes = [i for i, nf in c.node_facts() if nf.gpus and "torchao" in nf.versions]
    mixed = len(missing) < len(gpu_nodes)
    msg = (f"torchao is not installed on node(s) {', '.join(map(str, missing))}: FP8, which auto would run on this "
           "shape, stays off, on every node")
    if mixed:
        msg += "; the other nodes have it, and every rank must run the same matmuls"
    yield Advice(Level.WARNING if mixed else Level.INFO, "FP8_TORCHAO", msg,
                 Fix("Install torchao", hint=TORCHAO_HINT.format(node=missing[0])), node=missing[0])


@rule
def fp8_on(c: Context) -> Iterable[Advice]:
    run = _run(c)
    if c.spec is None or c.cpu or c.gpu is None or not c.gpu.fp8 or c.spec.is_moe:
        return  # a mixture of experts: FP8_UNMEASURED
    d = fp8_decision(c.spec, run, c.fp8_gpu, c.gpu.memory_gib, c.preset.world_size)
    if not d.on or d.measured is None:
        return
    x, why, row, method = d.speedup, d.why, d.measured, fp8_method(run)
    what = ("the frozen base's linears of the decoder layers (LoRA's adapters stay bf16)" if method == "lora"
            else "the decoder layers' linears")
    who = "LoRA" if method == "lora" else "full fine-tuning"
    if x == 1.0:  # within noise, or measured faster only at a larger size or in longer rows
        verdict = (f"no faster: {row.ratio:.2f}x bf16's tokens/s through the worker for {who}, {row.shape} "
                   f"({row.source}), is within noise or measured past this run's size or rows; the step time "
                   "counts no change")
    else:
        verdict = (f"{'slower' if x < 1.0 else 'faster'}: {x:.2f}x bf16's tokens/s through the worker for {who}, "
                   f"{row.shape} ({row.source}), counted in the step time")
    slower = x < 1.0
    yield Advice(Level.WARNING if slower else Level.INFO, "FP8_ON",
                 f"FP8 matmuls on {c.gpu.name} ({why}; torchao, tensorwise) for {what}; the embedding and LM head "
                 f"stay bf16. It measured {verdict}. The run proves FP8 "
                 "engaged: its log and metrics.jsonl name the converted layers and the FP8 matmuls of step 2, and its "
                 "first 8 steps check the FP8 loss against bf16's (past 2%, on stops the run and auto goes back to "
                 "bf16)",
                 AUTO if run.fp8 == "on" else Fix("Keep bf16 matmuls", {"training.fp8": "off"}))
