"""The lines of the GPU proof (bench/gpu_proof.py): what each one runs, on how many GPUs, and its verdict.

A line is a function of the proof's context that returns a Result: pass, fail, slow (a speed more than 10% under
the figure the README states) or skipped, with the reason. Every multi-process line also runs on CPU ranks
(gloo, the tiny built-in models) with --cpu, which is how the suite tests the proof; the lines that only a GPU
can answer (NCCL's transport, speeds, the estimator's scaling on GPUs) then say why they were skipped.
"""

from __future__ import annotations

from proof_common import (  # noqa: F401
                          BENCH,
                          GPU_SHAPE,
                          ROOT,
                          SLOW_BELOW,
                          TOL,
                          VERDICTS,
                          Context,
                          Line,
                          LineFailed,
                          Result,
                          free_port,
                          tail,
                          torchrun,
)
from proof_curves import compare, moe_zero3, sequence_parallel, sharded_4bit, zero_curve  # noqa: F401
from proof_nodes import _check, _launcher, nccl_transport, with_nodes
from proof_scaling import collectives, estimator_with, scaling, scaling_run_shape  # noqa: F401
from proof_speed import (  # noqa: F401
                         REFERENCES,
                         _speed_result,
                         dpo_speed_result,
                         reference,
                         speed_dpo,
                         speed_longest,
                         speed_moe,
                         speed_train,
                         verdict_of_speed,
)

LINES: list[Line] = [
    Line("collectives", "NCCL all-reduce / all-gather bus bandwidth, fed to the estimator", 0, False, 40,
         collectives),
    Line("check", "`qwen-tui check` on two nodes over SSH, with its rehearsal", 2, False, 60,
         with_nodes("check", _check), needs=("paramiko",)),
    Line("nccl-transport", "the rehearsal's NCCL transport verdict (NET/IB or NET/Socket)", 2, True, 1,
         nccl_transport, after=("check",)),
    Line("launcher", "qwen-tui's launcher: two torchrun agents over SSH, each with its GPUs", 2, False, 90,
         with_nodes("launcher", _launcher), needs=("paramiko",)),
    Line("zero2-curve", "ZeRO-2 on 2 GPUs reproduces 1 GPU's loss and grad-norm curve", 2, False, 100,
         zero_curve(2), needs=("deepspeed",)),
    Line("zero3-curve", "ZeRO-3 on 2 GPUs reproduces 1 GPU's loss and grad-norm curve", 2, False, 60,
         zero_curve(3), needs=("deepspeed",)),
    Line("moe-zero3", "MoE under ZeRO-3 with leaf modules reproduces 1 GPU's curve", 2, False, 120, moe_zero3,
         needs=("deepspeed",)),
    Line("sequence-parallel", "sequence parallelism 2 reproduces one GPU's loss", 2, False, 110, sequence_parallel,
         needs=("deepspeed",)),
    Line("sharded-4bit", "the 4-bit base sharded by ZeRO-3 (Q-LoRA)", 2, False, 120, sharded_4bit,
         needs=("deepspeed", "bitsandbytes")),
    Line("scaling", "scaling efficiency 1 -> N GPUs beside the estimator's prediction", 0, True, 150, scaling,
         needs=("deepspeed",), after=("collectives",)),
    Line("speed-7b-lora", "fast path: Qwen2.5-7B LoRA tokens/s and MFU", 1, True, 130,
         speed_train("ours-lora-7b", "speed-7b-lora"), needs=("liger_kernel",)),
    Line("speed-7b-lora-dpo", "fast path: Qwen2.5-7B LoRA DPO tokens/s and MFU, beside SFT's", 1, True, 170,
         speed_dpo, needs=("liger_kernel",), after=("speed-7b-lora",)),
    Line("speed-1.5b-full", "fast path: Qwen2.5-1.5B full tokens/s and MFU", 1, True, 70,
         speed_train("ours-full-1.5b", "speed-1.5b-full"), needs=("liger_kernel",)),
    Line("speed-moe-lora", "fast path: Qwen3-30B-A3B-shape LoRA tokens/s and MFU", 1, True, 130, speed_moe,
         needs=("liger_kernel",)),
    Line("speed-longest-record", "the longest single record (196,608 tokens, 7B LoRA) tokens/s and MFU", 1, True,
         160, speed_longest),
]
