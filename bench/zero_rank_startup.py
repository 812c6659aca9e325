"""CPU of a short 2-process ZeRO run of the tiny model, with and without Inductor loaded for DeepSpeed's Muon module.

Every ZeRO engine imports DeepSpeed's Muon optimizer module; imported plainly, it wraps its kernels in
torch.compile, whose set-up loads Inductor. The worker imports it first with TorchDynamo off
(training.runtime.unused_imports.load_deepspeed_muon_uncompiled). Side by side, interleaved so both see the same
load:

  worker  the worker as it is
  plain   the same run with the worker's early import turned off: DeepSpeed imports the module by itself

Each run is `torchrun --nproc_per_node 2 -m training.finetune` on CPU (gloo), 12 steps of the demo chat data,
no save. CPU is the user + system time of torchrun and its ranks together.

    python bench/zero_rank_startup.py [--runs 3] [--stage 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The rank's entry point: the worker, or the worker without its early import of the Muon module (DeepSpeed then
# imports it plainly, as it did before).
ENTRY = """
import os, sys
sys.path.insert(0, os.environ["BENCH_ROOT"])
if os.environ.get("BENCH_PLAIN_MUON") == "1":
    from training.runtime import unused_imports
    unused_imports.load_deepspeed_muon_uncompiled = lambda client_optimizer: False
from training.finetune import _exit_now, main
_exit_now(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(entry: Path, model: Path, data: Path, out: Path, stage: int, plain: bool) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one torchrun job and its ranks."""
    env = {**os.environ, "BENCH_ROOT": str(ROOT), "BENCH_PLAIN_MUON": "1" if plain else "0", "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(entry),
           "--output_dir", str(out), "--model_name_or_path", str(model), "--data_path", str(data),
           "--model_max_length", "128", "--max_steps", "12", "--save_strategy", "no", "--logging_steps", "1",
           "--deepspeed", f"builtin:zero{stage}", "--per_device_train_batch_size", "2",
           "--gradient_accumulation_steps", "2", "--seed", "7"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        sys.exit(f"the run failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of each variant, interleaved (default 3)")
    ap.add_argument("--stage", type=int, choices=(2, 3), default=3, help="ZeRO stage (default 3)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from training.demo_data.make_demo_chat import build
    from training.model.tiny import build_tiny

    with tempfile.TemporaryDirectory(prefix="zero-startup-") as tmp:
        tmp = Path(tmp)
        model = build_tiny(tmp / "tiny-qwen2")
        data = tmp / "train.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in build()), encoding="utf-8")
        entry = tmp / "entry.py"
        entry.write_text(ENTRY, encoding="utf-8")
        one_run(entry, model, data, tmp / "warm", args.stage, plain=False)  # tokenized cache and .pyc files
        figures: dict[str, list[tuple[float, float]]] = {"worker": [], "plain": []}
        for i in range(args.runs):
            for name in ("plain", "worker") if i % 2 else ("worker", "plain"):
                figures[name].append(one_run(entry, model, data, tmp / f"{name}{i}", args.stage, name == "plain"))
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for k, v in figures.items()}
    report = {"stage": args.stage, "runs": args.runs,
              **{f"{k}_cpu_s": round(c, 2) for k, (c, _) in med.items()},
              **{f"{k}_wall_s": round(w, 2) for k, (_, w) in med.items()},
              "cpu_ratio_plain_to_worker": round(med["plain"][0] / med["worker"][0], 3)}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"2-process ZeRO-{args.stage} run of the tiny model, median of {args.runs} each (CPU-s of torchrun "
              f"and its ranks; wall s)")
        for k, (c, w) in med.items():
            print(f"  {k:7s} {c:6.2f} CPU-s  {w:6.2f} s")
        print(f"  plain / worker CPU: {report['cpu_ratio_plain_to_worker']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
