"""The memory probe on a real GPU when a probe runs out of memory: the worker's probe_plan catches CUDA's
out-of-memory error, frees what the probe held, and bounds the rows below it.

    python bench/probe_oom.py --out bench/results/probe_oom-DATE-GPU.json   # a CUDA GPU, ~10 s

Each probe allocates what a step would at that row width, as FP8 full fine-tuning of a 1.5B model grew (a moment
that hardly grows with the row in small rows, then a steep slope: training/fast/autobatch.py), scaled so that the
first confirming probe asks for more than the GPU has. Then the GPU's allocator must give back what it held (a
step of the planned rows allocates again), and the plan's rows must fit beside the optimizer states it counts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    p.add_argument("--seq", type=int, default=1024, help="tokens of one record (default 1024)")
    args = p.parse_args(argv)
    import torch

    from training.fast import autobatch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    device = torch.device("cuda")
    total = torch.cuda.get_device_properties(device).total_memory
    # flat to three records, then steep enough that 16 records ask for 1.2x the GPU
    flat, knee = 0.07 * total, 3 * args.seq
    per_token = (1.2 * total - flat) / (16 * args.seq - knee)

    def wanted(tokens: int) -> int:
        return int(flat + max(0, tokens - knee) * per_token)

    model = torch.nn.Linear(64, 64, device=device)  # its Adam states: the optimizer still to come
    asked: list[int] = []

    def run_probe(tokens: int) -> None:
        asked.append(tokens)
        held = torch.empty(wanted(tokens), dtype=torch.uint8, device=device)
        model(torch.randn(8, 64, device=device)).sum().backward()
        del held

    model(torch.randn(8, 64, device=device)).sum().backward()  # cuBLAS's workspace, allocated once, stays
    model.zero_grad(set_to_none=True)
    before = torch.cuda.memory_allocated(device)
    plan = autobatch.probe_plan(model, run_probe, device, args.seq)  # one process: no agree, errors caught
    after = torch.cuda.memory_allocated(device)
    step = torch.empty(wanted(plan.tokens), dtype=torch.uint8, device=device)  # the planned rows' step
    del step
    checks = {
        "a probe ran out of memory": plan.ceiling is not None and plan.ceiling in asked,
        "the rows stay under it": plan.fits and plan.tokens < (plan.ceiling or 0),
        "the allocator gave it back": after <= before,
        "the planned rows fit the fraction": wanted(plan.tokens) <= 0.85 * total,
    }
    doc = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(device),
           "total_gib": round(total / 2**30, 2), "torch": torch.__version__, "probes": asked,
           "allocated_before_after": [before, after], "ceiling": plan.ceiling, "rows": plan.tokens, "rows_gib": round(wanted(plan.tokens) / 2**30, 2),
           "checks": checks}
    for k, v in checks.items():
        print(f"{'ok ' if v else 'BAD'} {k}")
    print(f"probes {asked}; ran out at {plan.ceiling}; rows {plan.tokens} ({doc['rows_gib']} GiB of "
          f"{doc['total_gib']})")
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
