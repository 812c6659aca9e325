"""Advice for FP8 (training.fp8: the worker's --fp8, torchao's float8 matmuls), with what was measured.

FP8_CANNOT_RUN   training.fp8 is on where the worker refuses it at set-up: Q-LoRA, a precision other than bf16,
                 CPU processes, a GPU type without FP8 tensor cores, or a node whose probe found no torchao
FP8_UNMEASURED   training.fp8 is on for a shape auto keeps in bf16 (under 7B-class, or a mixture of experts): the
                 1.5B shape measured 1.03x, so it may run slower; the estimate counts no speed-up
FP8_TORCHAO      auto would run FP8 here, but a node has no torchao: every node stays bf16 (the ranks run the same
                 matmuls or none in FP8)
FP8_ON           FP8 runs on this preset: the measured speed-up the estimate counts, and how the run proves it
"""

from __future__ import annotations

from collections.abc import Iterable

from ..base.levels import Level
from ..plan.estimate import FP8_AUTO_MIN_HIDDEN, FP8_MEASURED, RunShape, fp8_runs, fp8_speedup
from .core import Advice, Context, Fix, rule

AUTO = Fix("FP8 auto (where it runs and pays)", {"training.fp8": "auto"})
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
    if run.fp8 != "on" or c.spec is None or not fp8_runs(c.spec, run, c.fp8_gpu)[0]:
        return
    if c.spec.is_moe:
        what = "a mixture of experts, where FP8 was not measured (its experts are not linear layers torchao converts)"
    elif c.spec.hidden < FP8_AUTO_MIN_HIDDEN:
        what = (f"hidden size {c.spec.hidden}, under the 7B-class {FP8_AUTO_MIN_HIDDEN} where FP8 was measured faster "
                f"(the 1.5B shape ran 1.03x: {FP8_MEASURED})")
    else:
        return
    yield Advice(Level.WARNING, "FP8_UNMEASURED",
                 f"training.fp8 is on for {what}: it may run no faster than bf16, and the estimate counts no "
                 "speed-up; auto would keep it in bf16", AUTO)


@rule
def fp8_torchao(c: Context) -> Iterable[Advice]:
    run = _run(c)
    missing = c.torchao_missing()
    if run.fp8 != "auto" or not missing or c.spec is None or c.gpu is None or not c.gpu.fp8:
        return
    if not fp8_runs(c.spec, run, True)[0]:
        return  # auto would keep this run in bf16 anyway
    gpu_nodes = [i for i, nf in c.node_facts() if nf.gpus and "torchao" in nf.versions]
    mixed = len(missing) < len(gpu_nodes)
    x = fp8_speedup(c.spec, run, True)
    msg = (f"torchao is not installed on node(s) {', '.join(map(str, missing))}: FP8 (about {x:.2f}x tokens/s "
           f"measured on this shape's class) stays off, on every node")
    if mixed:
        msg += "; the other nodes have it, and every rank must run the same matmuls"
    yield Advice(Level.WARNING if mixed else Level.INFO, "FP8_TORCHAO", msg,
                 Fix("Install torchao", hint=TORCHAO_HINT.format(node=missing[0])), node=missing[0])


@rule
def fp8_on(c: Context) -> Iterable[Advice]:
    run = _run(c)
    if c.spec is None or c.cpu or c.gpu is None or not c.gpu.fp8:
        return
    on, why = fp8_runs(c.spec, run, c.fp8_gpu)
    x = fp8_speedup(c.spec, run, c.fp8_gpu)
    if not on or x <= 1.0:
        return
    yield Advice(Level.INFO, "FP8_ON",
                 f"FP8 matmuls on {c.gpu.name} ({why}; torchao, tensorwise): {x:.2f}x tokens/s measured for "
                 f"{'LoRA on a frozen FP8 base' if run.method != 'full' else 'full fine-tuning'} of a 7B shape "
                 f"({FP8_MEASURED}), counted in the step time; the adapters, embedding and LM head stay bf16. The run "
                 "proves it: its log and metrics.jsonl name the converted layers and the FP8 matmuls of step 2, and "
                 "its first 8 steps check the FP8 loss against bf16's (auto goes back to bf16 past 2%)",
                 Fix("Keep bf16 matmuls", {"training.fp8": "off"}))
