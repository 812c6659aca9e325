"""`qwen-tui data PRESET [--json]`: the data preview (records, lengths, supervised share, time per epoch).

The counting runs on the master node (`python -m training.datapreview`, the
worker's tokenizer, chat template and encoder); this process imports no torch.
JSON keys: see qwen_tui.advice.datapreview.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..advice.datapreview import histogram_lines, summary_lines
from ..plan.estimate import GPUS
from ..preset.files import load_preset
from ..run.tools.data_preview import DEFAULT_TIMEOUT_S, DataPreviewError, preview
from .estimate import gpu_name
from .facts_file import read_facts_file
from .options import DeprecatedAlias


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("data", help="preview a preset's data: records, token lengths, supervised share, "
                              "time per epoch (tokenized on the master, as the worker does)",
                              description="Preview a preset's data as the worker will see it: tokenized on the "
                              "master node with the model's own tokenizer and chat template, by the worker's own "
                              "encoder. Prints the records (usable, dropped, cut), tokens and the supervised share, "
                              "token lengths, steps and tokens per epoch, the padding, the time per epoch at the "
                              "estimated speed, and advice with its fix when records are cut or padding is high.")
    p.add_argument("preset", help="a preset YAML file")
    p.add_argument("--json", action="store_true", help="machine-readable output (keys in qwen_tui/advice/datapreview.py)")
    p.add_argument("--facts", metavar="FACTS.json", help="cluster facts from a check, for the speed estimate")
    p.add_argument("--gpu", choices=sorted(GPUS), type=gpu_name, metavar="NAME",
                   help="GPU model for the speed estimate when there are no facts, one of " + ", ".join(sorted(GPUS))
                   + " (any case: h100 is H100)")
    p.add_argument("--link-gbps", type=float, metavar="GBPS", dest="link_gbps",
                   help="the line rate of the link between nodes (one NIC), Gbit/s, for the speed estimate (taken "
                   "at 0.9, as estimate --nic-gbps is)")
    p.add_argument("--bandwidth-gbps", type=float, dest="link_gbps", action=DeprecatedAlias, new="--link-gbps")
    p.add_argument("--tokens-per-second", type=float, default=None,
                   help="the run's real speed (all GPUs together), when you know it better than the estimate")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds the preview may take on the master (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--accept-new-host-keys", action="store_true", help="trust a remote master's new host key")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from ..nodes.connect import transport_for
    from ..nodes.transport.protocol import TransportError

    preset = load_preset(args.preset)
    facts = None
    if args.facts:
        try:
            facts = read_facts_file(args.facts)
        except ValueError as e:
            print(f"qwen-tui: {e}", file=sys.stderr)
            return 2
    master = preset.cluster.nodes[0]
    try:
        transport = transport_for(master, preset, accept_new_host_keys=args.accept_new_host_keys)
    except TransportError as e:
        print(f"qwen-tui: node 0 ({master.label}): {e}", file=sys.stderr)
        return 1
    try:
        report = preview(preset, transport, facts, base_dir=os.getcwd(), gpu=args.gpu,
                         nic_gbps=args.link_gbps, tokens_per_second_override=args.tokens_per_second,
                         timeout=args.timeout)
    except DataPreviewError as e:
        print(f"qwen-tui: {e}", file=sys.stderr)
        return 1
    finally:
        transport.close()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{args.preset}: {report['data']} with {report['model']}")
    for line in summary_lines(report):
        print("  " + line)
    if report["epoch_seconds"] is None and report["steps_per_epoch"]:
        print("  (--tokens-per-second gives the time per epoch at a speed you know)")
    print("token lengths (whole records, before the cut):")
    for line in histogram_lines(report["histogram"], max_length=report["model_max_length"]):
        print("  " + line)
    for a in report["advice"]:
        fix = a["fix"]
        how = f"  -> {fix['label']}" + (f"; {fix['hint']}" if fix and fix["hint"] else "") if fix else ""
        print(f"{a['level']:7s} {a['code']}: {a['message']}{how}")
    return 0
