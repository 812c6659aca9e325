"""`qwen-tui estimate PRESET [--json]`: memory per GPU, step time, scaling and the advice.

The JSON keys are documented in docs/guides/estimates.md and stay stable: gpu_memory_gb,
step_time_s, tokens_per_second, scaling_efficiency, advice, plus the details.
Nothing here writes the preset: a fix is shown, never applied.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..advice.report import NODES_WORTH_LIMIT, build_report, human_count, model_line
from ..plan.estimate import GPUS
from ..plan.estimate_comm import NIC_EFFICIENCY
from ..plan.estimate_time import FAST_PATH_EFFICIENCY, ZERO_EFFICIENCY
from ..preset.files import load_preset
from . import styles
from .facts_file import read_facts_file
from .options import DeprecatedAlias


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("estimate", help="memory per GPU, step time, scaling and advice for a preset (no GPU "
                              "needed)",
                              description="Estimate a preset's memory per GPU (weights, gradients, optimizer, "
                              "activations, logits, overhead), step time, tokens/s and scaling over 1..N nodes, and "
                              "give the advice with its fixes, from the model's config alone: no GPU is needed. "
                              "The bandwidth between nodes comes from --bus-gbps, else a check's rehearsal "
                              "(--facts), else the NICs, else iperf3, and the output says which.")
    p.add_argument("preset", help="a preset YAML file")
    p.add_argument("--json", action="store_true", help="machine-readable output (keys in the manual: docs/guides/estimates.md)")
    p.add_argument("--facts", metavar="FACTS.json", help="cluster facts from `qwen-tui check --out FILE` (its rehearsal's all-reduce bandwidth, GPUs, "
                   "InfiniBand ports, iperf3 links)")
    p.add_argument("--gpu", choices=sorted(GPUS), type=gpu_name, metavar="NAME",
                   help="GPU model when there are no probe facts, one of " + ", ".join(sorted(GPUS))
                   + " (any case: h100 is H100)")
    p.add_argument("--gpu-memory-gib", type=float, help="memory of the smallest GPU, GiB (overrides --gpu and facts)")
    p.add_argument("--bus-gbps", type=float, metavar="GBPS", dest="bus_gbps",
                   help="per-node bus bandwidth between nodes, Gbit/s: what NCCL's all-reduce reaches across the "
                   "nodes (nccl-tests' busbw in GB/s, x 8), about the sum of the NICs NCCL uses on a node, not one "
                   "link's speed (overrides the facts)")
    p.add_argument("--bandwidth-gbps", type=float, dest="bus_gbps", action=DeprecatedAlias, new="--bus-gbps")
    p.add_argument("--nic-gbps", type=float, metavar="GBPS",
                   help=f"line rate of one NIC NCCL uses between nodes (e.g. 400 for NDR), with --nics; the estimate "
                   f"takes {NIC_EFFICIENCY} of rate x count as the bus bandwidth (used when no rehearsal measured it)")
    p.add_argument("--nics", type=int, default=None, metavar="N", help="NICs per node NCCL uses (with --nic-gbps; "
                   "default 1)")
    p.add_argument("--intra-node-gbs", type=float, metavar="GBS",
                   help="NCCL bus bandwidth inside a node, GB/s (default: the GPU type's, e.g. H100 NVLink 360; "
                   "PCIe-only nodes ~25)")
    p.add_argument("--efficiency", type=float, default=None,
                   help=f"model FLOPs utilisation assumed for compute time (default: the worker's by its path: "
                   f"{FAST_PATH_EFFICIENCY} without DeepSpeed, {ZERO_EFFICIENCY[(2, True)]} under ZeRO-2, "
                   f"{ZERO_EFFICIENCY[(3, True)]} under ZeRO-3 for full fine-tuning and {ZERO_EFFICIENCY[(3, False)]} "
                   "with a frozen base; Q-LoRA runs at 0.8x)")
    p.add_argument("--max-nodes", type=int, default=None, help="scaling table up to this many nodes (default max(4, nodes))")
    p.set_defaults(func=run)
    return p


# The advice that only runs when the GPU's memory is known (advice/rules.py's memory rules).
NEEDS_GPU_MEMORY = ("OOM", "MEMORY_TIGHT", "CKPT_UNNEEDED", "ZERO_NOT_NEEDED")


def gpu_name(text: str) -> str:
    """The table's spelling of a GPU name typed in any case; anything else is left for argparse to refuse."""
    return {name.lower(): name for name in GPUS}.get(text.strip().lower(), text)


def _secs(x: float) -> str:
    return f"{x * 1000:.3g} ms" if x < 1 else f"{x:.2f} s"


def _yaml(v: Any) -> str:
    """A fix's value as the preset file spells it (null, true, 'none')."""
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else repr(v)


def _print_human(report: dict[str, Any], preset_path: str) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    gpu = report["gpu"]
    bw = report["bandwidth"]
    link = (f"between nodes {bw['gbps']:.4g} Gbit/s ({bw['detail']})" if bw["gbps"]
            else "between nodes: not measured")
    if report["cpu"]:
        con.print(f"[bold]{preset_path}[/]: {report['world_size']} CPU process(es) on {report['nodes']} node(s); "
                  "no step-time estimate (it models GPUs and their links only)"
                  + (f"; {link}" if bw["gbps"] else ""), highlight=False)
    else:
        con.print(f"[bold]{preset_path}[/]: {report['world_size']} GPU(s) on {report['nodes']} node(s); "
                  f"GPU {gpu['name'] or 'unknown'} ({gpu['memory_gib'] or '?'} GiB, {gpu['source'] or 'unknown'})"
                  + (f"; {link}" if report["nodes"] > 1 or bw["gbps"] else ""), highlight=False)
    if report["error"]:
        con.print(f"[{styles.WARN}]{report['error']}[/]")
    m = report["gpu_memory_gb"]
    if m:
        mdl = report["model"]
        con.print(f"model {mdl['name']}: {model_line(mdl)}, {human_count(mdl['trainable_params'])} trained")
        tb = Table(title=f"Memory per {'process' if report['cpu'] else 'GPU'} (GiB) at the peak: {m['phase']}")
        for col in ("weights", "gradients", "optimizer", "activations", "logits", "overhead", "total"):
            tb.add_column(col, justify="right")
        tb.add_row(*(f"{m[k]:.2f}" for k in ("weights", "gradients", "optimizer", "activations", "logits",
                                              "overhead", "total")))
        con.print(tb)
        fits = m["fits"]
        if not report["cpu"]:
            con.print("fits" if fits else f"[{styles.FAIL}]does not fit[/]" if fits is False
                      else "GPU memory unknown: pass --gpu",
                      f"(torch peak allocated ~{m['peak_allocated']:.1f} GiB)")
    s = report["step"]
    if s is not None:
        comm = f"communication {_secs(s['comm_s'])} ({_secs(s['exposed_comm_s'])} not hidden)"
        con.print(f"step: {report['tokens_per_step']:,} tokens, compute {s['compute_s']:.2f} s, {comm}, "
                  f"~{report['step_time_s']:.2f} s/step, ~{report['tokens_per_second']:,.0f} tokens/s "
                  f"(efficiency {report['efficiency']} assumed)")
    elif not report["cpu"] and report["gpu_memory_gb"]:
        con.print(f"step: {report['tokens_per_step']:,} tokens; s/step and tokens/s [{styles.WARN}]unknown[/]",
                  highlight=False)
    if not report["cpu"] and report["gpu_memory_gb"]:
        for why in report["speed_unknown"]:
            con.print(f"[{styles.WARN}]{why}[/]", highlight=False)
    if report["scaling_efficiency"]:
        st = Table(title="Scaling (same micro-batch per GPU)"
                   + (f"; bandwidth between nodes from {bw['source']}" if bw["gbps"] else ""))
        for col in ("nodes", "s/step", "tokens/s", "efficiency", "no overlap"):
            st.add_column(col, justify="right")
        def pct(x):
            return "unknown" if x is None else f"{x:.0%}"

        for p in report["scaling_efficiency"]:
            st.add_row(str(p["nodes"]), "unknown" if p["step_time_s"] is None else f"{p['step_time_s']:.2f}",
                       "unknown" if p["tokens_per_second"] is None else f"{p['tokens_per_second']:,.0f}",
                       pct(p["scaling_efficiency"]), pct(p["efficiency_no_overlap"]))
        con.print(st)
        worth = report["nodes_worth_it"]
        if worth is not None:
            con.print(f"worth it up to {worth} node(s)" + (" (the most checked)" if worth >= NODES_WORTH_LIMIT else "")
                      + ": past that a node adds less than half its GPUs' worth", highlight=False)
    if s is not None or report["scaling_efficiency"]:
        rec = report["recommended"]
        if rec["micro_batch"] is not None:
            con.print(f"recommended: micro-batch up to {rec['micro_batch']}, gradient checkpointing "
                      f"{'on' if rec['gradient_checkpointing'] else 'off'}")
    unchecked = not report["cpu"] and gpu["memory_gib"] is None
    if unchecked:  # silence here would read as "it fits"
        con.print(f"[{styles.WARN}]GPU type unknown: memory fit not checked.[/] The advice "
                  f"{', '.join(NEEDS_GPU_MEMORY)} "
                  "and the recommended micro-batch need the GPU's memory: pass --gpu (or --gpu-memory-gib, "
                  "or --facts from `qwen-tui check`)", highlight=False)
    if not report["advice"]:
        con.print(f"[{styles.WARN}]no advice (memory fit not checked)[/]" if unchecked
                  else f"[{styles.GOOD}]no advice[/]")
    for a in report["advice"]:
        fix = a["fix"]
        how = ""
        if fix:
            how = f"  -> {fix['label']}" + (f" ({', '.join(f'{k}: {_yaml(v)}' for k, v in fix['changes'].items())})"
                                            if fix["changes"] and len(str(fix["changes"])) < 120 else "")
            if fix["hint"]:
                how += f"; {fix['hint']}"
        con.print(f"[{styles.level_style(a['level'])}]{a['level']:7s}[/] {a['code']}: {a['message']}{how}",
                  highlight=False)


def run(args: argparse.Namespace) -> int:
    preset = load_preset(args.preset)
    facts = None
    if args.facts:
        try:
            facts = read_facts_file(args.facts)
        except ValueError as e:
            print(f"qwen-tui: {e}", file=sys.stderr)
            return 2
    for name in ("bus_gbps", "nic_gbps", "nics", "intra_node_gbs"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            print(f"qwen-tui: --{name.replace('_', '-')} must be positive, got {v:g}", file=sys.stderr)
            return 2
    if args.nics is not None and args.nic_gbps is None:
        print("qwen-tui: --nics needs --nic-gbps (the rate of one NIC)", file=sys.stderr)
        return 2
    report = build_report(preset, facts, gpu=args.gpu, gpu_memory_gib=args.gpu_memory_gib,
                          bandwidth_gbps=args.bus_gbps, efficiency=args.efficiency, max_nodes=args.max_nodes,
                          nic_gbps=args.nic_gbps, nics=args.nics, intra_node_gbs=args.intra_node_gbs)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_human(report, args.preset)
    return 0
