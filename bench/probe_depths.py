"""What one decoder layer of the worker costs a token, read from the worker's own memory probe at two depths.

    python bench/probe_depths.py --out bench/results/probe_depths-DATE-GPU.json   # a CUDA GPU, ~6 minutes

The worker's memory probe (training/fast/autobatch.py) logs the bytes a token its step's peak grows by. The same
shape at two depths (layers L1 < L2, everything else alike: random weights, the tiny tokenizer's 1,024-token
vocabulary, rows of 1,024-token records) differs by L2 - L1 layers, so their difference over L2 - L1 is what one
compiled layer keeps for its backward, with whatever the step holds beside it at its peak: the figure the memory
estimate's per-layer count (qwen_tui/plan/estimate.py `_layer_act_bytes`) is checked against. Each run stops after
its first step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from fp8_worker import CASES, write_data, write_model  # noqa: E402  (bench/ is not a package)

# (name, fp8_worker's case it takes its shape and method from, the two depths)
PAIRS = {
    "lora-7b": ("lora-7b-rows", (4, 8)),
    "lora-1.5b": ("full-1.5b-rows", (4, 12)),
    "full-1.5b": ("full-1.5b-rows", (4, 12)),
}
SLOPE = re.compile(r"auto micro-batch: ([0-9.]+) MiB a token")
PROBES = re.compile(r"auto micro-batch probes: (.*)")


def run_depth(tmp: Path, name: str, base: dict, method: str, layers: int, timeout_s: float) -> dict:
    case = dict(base, method=method, layers=layers, zero=None, row=None)
    model = write_model(tmp, f"{name}-{layers}", case)
    data = tmp / "data.jsonl"
    if not data.exists():
        write_data(data, model, 8, case["seq"])
    out = tmp / f"out-{name}-{layers}"
    cmd = [sys.executable, "-m", "training.finetune", "--model_name_or_path", str(model), "--random_init",
           "--data_path", str(data), "--output_dir", str(out), "--max_steps", "1",
           "--per_device_train_batch_size", "8", "--model_max_length", str(case["seq"]), "--bf16",
           "--save_strategy", "no", "--logging_steps", "1", "--fp8", "off"]
    if method == "lora":
        cmd += ["--use_lora", "--lora_r", "64", "--lora_alpha", "16", "--lora_dropout", "0.05"]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=BENCH.parent, capture_output=True, text=True, timeout=timeout_s,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
        rc, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:  # past the budget: what it logged until then still says its probes
        rc, log = None, "".join(x.decode() if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
    slope, probes = SLOPE.findall(log), PROBES.findall(log)
    return {"layers": layers, "rc": rc, "wall_s": round(time.monotonic() - t0, 1),
            "mib_per_token": float(slope[-1]) if slope else None, "probes": probes[-1] if probes else None,
            "tail": None if slope else log[-2000:]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    p.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated (known: {', '.join(PAIRS)})")
    p.add_argument("--budget-s", type=float, default=500, help="skip what would start past this (default 500)")
    args = p.parse_args(argv)
    names = args.pairs.split(",")
    for n in names:
        if n not in PAIRS:
            p.error(f"--pairs: unknown {n!r} (known: {', '.join(PAIRS)})")
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU: the probe measures CUDA memory")
    start, rows = time.monotonic(), []
    with tempfile.TemporaryDirectory(prefix="probe_depths-") as t:
        for name in names:
            source, (l1, l2) = PAIRS[name]
            method = name.split("-")[0]
            runs = []
            for layers in (l1, l2):
                left = args.budget_s - (time.monotonic() - start)
                if left < 30:
                    break
                runs.append(run_depth(Path(t), name, CASES[source], method, layers, left))
            row = {"name": name, "shape": CASES[source]["shape"], "method": method, "runs": runs}
            if len(runs) == 2 and all(r["mib_per_token"] is not None for r in runs):
                per_layer = (runs[1]["mib_per_token"] - runs[0]["mib_per_token"]) / (l2 - l1)
                row["bytes_per_token_layer"] = round(per_layer * 2**20)
                row["mib_per_token_rest"] = round(runs[0]["mib_per_token"] - l1 * per_layer, 3)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "runs"}), [(r["layers"], r["mib_per_token"],
                  r["wall_s"]) for r in runs], flush=True)
            if args.out:  # after each pair: a call cut short keeps what it measured
                doc = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "rows": rows}
                Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if all("bytes_per_token_layer" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
