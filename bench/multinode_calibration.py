"""The step-time model against published multi-node measurements, and the time one estimate takes.

Each point is a published run (source and table in POINTS) at several GPU counts with the same micro-batch and
accumulation per GPU: its weak-scaling efficiency against the smallest count of the series is
tokens/s/GPU(n) / tokens/s/GPU(base). The model is given the model's shape, the GPU, the link the source names,
and the compute speed the source measured at the base point; it predicts the rest. tests/unit/test_estimate_calib.py
holds every point within 0.10 and most within 0.05; docs/multinode-calibration.md is this script's table.

    python bench/multinode_calibration.py            # the table (markdown) and the time per estimate call
    python bench/multinode_calibration.py --timing   # only the time per call
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qwen_tui.model.spec import ModelSpec
from qwen_tui.plan.estimate import GPUS, RunShape
from qwen_tui.plan.estimate_comm import NIC_EFFICIENCY
from qwen_tui.plan.estimate_time import estimate_step, flops_per_token

LLM_FOUNDRY = ("https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md")
TORCHTITAN = "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md"


def mpt(name: str, d: int, heads: int, layers: int) -> ModelSpec:
    """An MPT shape (GELU MLP of 4d: 12 d^2 per layer) as a ModelSpec with the same matmul parameters."""
    return ModelSpec(name=name, layers=layers, hidden=d, intermediate=round(8 * d / 3), heads=heads, kv_heads=heads,
                     vocab=50368, tied_embeddings=True, qkv_bias=False)


LLAMA31_8B = ModelSpec(name="Llama-3.1-8B", layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8,
                       vocab=128256, tied_embeddings=False, qkv_bias=False)
MPT = {k: mpt(f"MPT-{k}", *v) for k, v in {
    "125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24), "1b": (2048, 16, 24),
    "3b": (2560, 20, 32), "7b": (4096, 32, 32), "13b": (5120, 40, 40),
    # llm-foundry's scripts/train/yamls/pretrain/mpt-30b.yaml and mpt-70b.yaml
    "30b": (7168, 56, 48), "70b": (8192, 64, 80)}.items()}


@dataclass(frozen=True)
class Series:
    source: str
    where: str  # table / row description
    setup: str
    spec: ModelSpec
    gpu: str
    gpus_per_node: int
    nic_gbps: float  # per node, line rate
    seq: int
    micro_batch: int
    grad_accum: int
    ckpt: bool
    tps_per_gpu: dict[int, float]  # GPUs -> tokens/s per GPU, as published
    strategy: int = 3  # ZeRO stage the run's sharding matches (FSDP FULL_SHARD = 3)
    note: str = ""


A100_40 = "llm-foundry, A100 40GB with 1600 Gbps node-node interconnect (RoCE)"
H100_80 = "llm-foundry, H100 80GB BF16"
H100_LARGE = "llm-foundry, H100 80GB BF16 (Large Scale, >= 128 GPUs)"
LARGE_NOTE = "the table does not name the interconnect: 8 x 400 Gbit/s taken"
SERIES: list[Series] = [
    Series(LLM_FOUNDRY, A100_40, "MPT-125m, FSDP FULL_SHARD, bf16, seq 2048", MPT["125m"], "A100-40G", 8, 1600,
           2048, 26, 1, False, {16: 130535, 32: 127122, 64: 125234, 128: 123936}),
    Series(LLM_FOUNDRY, A100_40, "MPT-350m, FSDP FULL_SHARD, bf16, seq 2048", MPT["350m"], "A100-40G", 8, 1600,
           2048, 18, 1, False, {16: 55413, 32: 53811, 64: 52689, 128: 51934}),
    Series(LLM_FOUNDRY, A100_40, "MPT-760m, FSDP FULL_SHARD, bf16, seq 2048", MPT["760m"], "A100-40G", 8, 1600,
           2048, 12, 1, False, {16: 29607, 32: 29648, 64: 29344, 128: 28940}),
    Series(LLM_FOUNDRY, A100_40, "MPT-1b, FSDP FULL_SHARD, bf16, seq 2048", MPT["1b"], "A100-40G", 8, 1600,
           2048, 10, 1, False, {64: 19001, 128: 18647},
           note="the 32-GPU row of the same batch (15,555) is slower than 64 and 128 GPUs: not a scaling effect, "
                "left out"),
    Series(LLM_FOUNDRY, A100_40, "MPT-3b, FSDP FULL_SHARD, bf16, seq 2048", MPT["3b"], "A100-40G", 8, 1600,
           2048, 6, 1, False, {32: 9914, 64: 9736, 128: 9538}),
    Series(LLM_FOUNDRY, A100_40, "MPT-7b, FSDP FULL_SHARD, bf16, seq 2048, activation ckpt", MPT["7b"], "A100-40G",
           8, 1600, 2048, 18, 1, True, {32: 3725, 64: 3665, 128: 3623}),
    Series(LLM_FOUNDRY, A100_40, "MPT-13b, FSDP FULL_SHARD, bf16, seq 2048, activation ckpt", MPT["13b"],
           "A100-40G", 8, 1600, 2048, 16, 1, True, {64: 1976, 128: 1972}),
    Series(LLM_FOUNDRY, H100_80, "MPT-13b, FSDP FULL_SHARD, amp_bf16, seq 2048", MPT["13b"], "H100", 8, 3200,
           2048, 2, 1, False, {8: 4792, 16: 4767, 32: 4811, 64: 4800},
           note="the table does not name the interconnect: 8 x 400 Gbit/s taken (the efficiency is insensitive to it)"),
    Series(LLM_FOUNDRY, H100_80, "MPT-1b, FSDP FULL_SHARD, amp_bf16, seq 2048", MPT["1b"], "H100", 8, 3200,
           2048, 20, 1, False, {16: 46037, 32: 45130, 64: 44402},
           note="interconnect not named: 8 x 400 Gbit/s taken"),
    Series(LLM_FOUNDRY, H100_80, "MPT-3b, FSDP FULL_SHARD, amp_bf16, seq 2048", MPT["3b"], "H100", 8, 3200,
           2048, 6, 3, False, {32: 23021, 64: 22525}, note="interconnect not named: 8 x 400 Gbit/s taken"),
    # past 256 GPUs: 128 -> 256 -> 512 H100s, FULL_SHARD (ZeRO-3) from 7B to 70B and SHARD_GRAD_OP (ZeRO-2) below
    Series(LLM_FOUNDRY, H100_LARGE, "MPT-70b, FSDP FULL_SHARD, amp_bf16, seq 2048, activation ckpt", MPT["70b"],
           "H100", 8, 3200, 2048, 8, 1, True, {128: 1058, 256: 1035, 512: 1007}, note=LARGE_NOTE),
    Series(LLM_FOUNDRY, H100_LARGE, "MPT-30b, FSDP FULL_SHARD, amp_bf16, seq 2048, activation ckpt", MPT["30b"],
           "H100", 8, 3200, 2048, 8, 1, True, {128: 2199, 256: 2148, 512: 2115}, note=LARGE_NOTE),
    Series(LLM_FOUNDRY, H100_LARGE, "MPT-13b, FSDP FULL_SHARD, amp_bf16, seq 2048, activation ckpt", MPT["13b"],
           "H100", 8, 3200, 2048, 16, 1, True, {128: 5080, 256: 4989, 512: 4952}, note=LARGE_NOTE),
    Series(LLM_FOUNDRY, H100_LARGE, "MPT-7b, FSDP FULL_SHARD, amp_bf16, seq 2048", MPT["7b"],
           "H100", 8, 3200, 2048, 6, 1, False, {128: 10475, 256: 10119, 512: 9670}, note=LARGE_NOTE),
    Series(LLM_FOUNDRY, H100_LARGE, "MPT-3b, FSDP SHARD_GRAD_OP, amp_bf16, seq 2048", MPT["3b"],
           "H100", 8, 3200, 2048, 8, 1, False, {128: 23422, 256: 22772, 512: 21664}, strategy=2, note=LARGE_NOTE),
    Series(LLM_FOUNDRY, H100_LARGE, "MPT-1b, FSDP SHARD_GRAD_OP, amp_bf16, seq 2048", MPT["1b"],
           "H100", 8, 3200, 2048, 12, 1, False, {128: 44123, 256: 42555, 512: 39837}, strategy=2, note=LARGE_NOTE),
    Series(TORCHTITAN, "torchtitan performance.md, Tables 1 and 3 (FSDP)", "Llama 3.1 8B, FSDP2, bf16, seq 8192, "
           "selective activation ckpt, H100 96GB, 400 Gbit/s RDMA per GPU", LLAMA31_8B, "H100", 8, 3200,
           8192, 2, 1, True, {8: 5762, 128: 5605}),
    Series(TORCHTITAN, "torchtitan performance.md, Tables 1 and 3 (FSDP + torch.compile)", "Llama 3.1 8B, FSDP2 + "
           "torch.compile, bf16, seq 8192, selective activation ckpt, H100 96GB, 400 Gbit/s per GPU", LLAMA31_8B,
           "H100", 8, 3200, 8192, 2, 1, True, {8: 6667, 128: 6514}),
]


@dataclass(frozen=True)
class Point:
    series: Series
    gpus: int
    base_gpus: int
    measured: float
    predicted: float


def _tps(s: Series, gpus: int, eff: float) -> float:
    g = GPUS[s.gpu]
    run = RunShape(method="full", zero_stage=s.strategy, seq=s.seq, micro_batch=s.micro_batch,
                   grad_accum=s.grad_accum, gradient_checkpointing=s.ckpt)
    nodes = max(1, gpus // s.gpus_per_node)
    st = estimate_step(s.spec, run, nodes, min(gpus, s.gpus_per_node), s.nic_gbps * NIC_EFFICIENCY,
                       gpu_tflops=g.bf16_tflops, efficiency=eff, intra_node_gbs=g.intra_node_gbs, hbm_gbs=g.hbm_gbs)
    return st.tokens_per_second / gpus


def points() -> list[Point]:
    out = []
    for s in SERIES:
        base = min(s.tps_per_gpu)
        g = GPUS[s.gpu]
        run = RunShape(method="full", zero_stage=s.strategy, seq=s.seq, micro_batch=s.micro_batch,
                       gradient_checkpointing=s.ckpt)
        # the compute speed the source measured at its base point (model FLOPs with recompute / peak)
        eff = s.tps_per_gpu[base] * flops_per_token(s.spec, run) / (g.bf16_tflops * 1e12)
        ref = _tps(s, base, eff)
        for n, tps in sorted(s.tps_per_gpu.items()):
            if n == base:
                continue
            out.append(Point(s, n, base, tps / s.tps_per_gpu[base], _tps(s, n, eff) / ref))
    return out


def table() -> str:
    rows = ["| source | setup | GPUs (base) | measured | model | error |", "| --- | --- | --- | --- | --- | --- |"]
    for p in points():
        s = p.series
        rows.append(f"| [{s.where}]({s.source}) | {s.setup}; micro-batch {s.micro_batch}, accumulation "
                    f"{s.grad_accum}, {s.gpus_per_node} GPUs/node, {s.nic_gbps:g} Gbit/s/node"
                    f"{'; ' + s.note if s.note else ''} | {p.gpus} ({p.base_gpus}) | {p.measured:.3f} | "
                    f"{p.predicted:.3f} | {p.predicted - p.measured:+.3f} |")
    return "\n".join(rows)


# Qwen's own README ("Profiling of Memory and Speed"): Qwen-7B LoRA, batch 1 and accumulation 8 a GPU, A100-SXM4-80G,
# s/it at each sequence length on 1 GPU (finetune_lora_single_gpu.sh) and on 2 servers of 2 GPUs
# (finetune_lora_ds.sh, DeepSpeed ZeRO-2); the link between the servers is not named.
QWEN_README = "https://github.com/QwenLM/Qwen/blob/main/README.md"
QWEN1_7B = ModelSpec(name="Qwen-7B", layers=32, hidden=4096, intermediate=11008, heads=32, kv_heads=32, vocab=151936,
                     tied_embeddings=False, qkv_bias=True)
QWEN_LORA_S_PER_IT = {256: (1.2, 2.09), 512: (1.5, 3.16), 1024: (2.8, 5.17), 2048: (5.2, 9.25), 4096: (10.1, 18.1),
                      8192: (21.3, 37.4)}  # seq -> (1 GPU, 2 nodes x 2 GPUs)


def qwen_unexplained(links=(1.0, 10.0, 100.0)) -> str:
    """Qwen's 2 x 2-GPU LoRA points against the model at several links: a table for the calibration page."""
    g = GPUS["A100-80G"]
    rows = ["| sequence | measured | " + " | ".join(f"model at {b:g} Gbit/s" for b in links) + " |",
            "| --- | --- | " + " | ".join("---" for _ in links) + " |"]
    for seq, (one, four) in QWEN_LORA_S_PER_IT.items():
        base = RunShape(method="lora", zero_stage=None, seq=seq, micro_batch=1, grad_accum=8, lora_r=64,
                        gradient_checkpointing=True)
        eff = 8 * seq / one * flops_per_token(QWEN1_7B, base) / (g.bf16_tflops * 1e12)
        ref = estimate_step(QWEN1_7B, base, 1, 1, None, gpu_tflops=g.bf16_tflops, efficiency=eff,
                            intra_node_gbs=g.intra_node_gbs, hbm_gbs=g.hbm_gbs).tokens_per_second
        cells = []
        for bw in links:
            run = RunShape(method="lora", zero_stage=2, seq=seq, micro_batch=1, grad_accum=8, lora_r=64,
                           gradient_checkpointing=True)
            st = estimate_step(QWEN1_7B, run, 2, 2, bw, gpu_tflops=g.bf16_tflops, efficiency=eff,
                               intra_node_gbs=g.intra_node_gbs, hbm_gbs=g.hbm_gbs)
            cells.append(f"{st.tokens_per_second / 4 / ref:.2f}")
        rows.append(f"| {seq:,} | {one / four:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def time_per_call(n: int = 2000) -> float:
    """Seconds per estimate_step call on a 7B shape across 4 nodes (what the wizard calls on every edit)."""
    from qwen_tui.model.spec import resolve_model

    spec = resolve_model("Qwen/Qwen2.5-7B")
    run = RunShape(method="full", zero_stage=3, seq=2048, micro_batch=2, grad_accum=4)
    t = time.perf_counter()
    for _ in range(n):
        estimate_step(spec, run, 4, 8, 400.0)
    return (time.perf_counter() - t) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timing", action="store_true", help="only the time per estimate call")
    a = ap.parse_args(argv)
    if not a.timing:
        print(table())
        errs = [abs(p.predicted - p.measured) for p in points()]
        print(f"\n{len(errs)} points: max error {max(errs):.3f}, mean {sum(errs) / len(errs):.3f}, "
              f"within 0.05: {sum(e <= 0.05 for e in errs)}")
        print("\nQwen-7B LoRA, 2 x 2 A100 against 1 A100 (" + QWEN_README + "):\n" + qwen_unexplained())
    print(f"estimate_step: {time_per_call() * 1e6:.0f} us per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
