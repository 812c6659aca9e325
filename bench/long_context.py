"""The longest record one GPU trains: Qwen2.5-7B LoRA on single records of increasing length, through the worker.

    python bench/long_context.py --out bench/results/DIR                      # 32k, 64k, 128k, 192k tokens
    python bench/long_context.py --lengths 16384,32768,65536,131072,196608 --budget-s 470 --out DIR
    python bench/long_context.py --cpu-smoke --out /tmp/lc                     # the tiny shape on CPU, seconds

For every length L (ascending) one `python -m training.finetune` process trains a random-init Qwen2.5-7B shape
(bench/train_speed.py's, built on the GPU with --random_init) with LoRA r64 on all linear projections (dropout
0.05, bf16) on records of exactly L tokens, one record a step and a row (--packing_tokens L), with what the
worker offers long records: checkpointed layers, the fused loss (no full logits), packed varlen attention, and
from 32k tokens the tiled MLP (chosen automatically; the result records the worker's fast-path choices). The first
step is untimed where the records are short enough for a second one to fit the budget; throughput is real tokens
over the timed steps' time. A length that runs out of memory ends the climb (longer ones would too).

Beside each measurement: the worker's peak allocated memory (metrics.jsonl) and what qwen_tui.plan.longcontext
predicts for that row (the model behind `qwen-tui estimate`'s long-context limit and the LONG_RECORD_OOM advice),
and the longest record it predicts for the GPU. --budget-s bounds the whole call: a length whose predicted time
(from the last one's step time, quadratic in the length) would not fit what is left is skipped and said so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from train_speed import PEAK_TFLOPS, flops_per_token, write_worker_inputs  # noqa: E402

DEFAULT_LENGTHS = "32768,65536,131072,196608"
OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED")


def _training(length: int):
    """The run as qwen_tui.plan.longcontext sees it (a preset's training section)."""
    return SimpleNamespace(method="lora", zero_stage=None, offload="none", precision="bf16", model_max_length=length,
                           per_device_train_batch_size=1, gradient_accumulation_steps=1, gradient_checkpointing=True,
                           lora_r=64, lora_dropout=0.05, lora_target_modules=None, sequence_parallel_size=1)


def predicted(length: int, gpu_gib: float | None) -> dict:
    from qwen_tui.model.spec import known_spec
    from qwen_tui.plan.longcontext import longest_record, row_memory

    spec = known_spec("Qwen/Qwen2.5-7B-Instruct")
    row = row_memory(spec, _training(length), 1, length)
    out = {"predicted_gib": round(row.total, 2), "predicted_tiled": row.tiled}
    if gpu_gib:
        out["predicted_longest"] = longest_record(spec, _training(length), 1, gpu_gib)
    return out


def run_length(length: int, steps: int, warmup: int, args, log_path: Path, timeout: float) -> dict:
    shape = "tiny" if args.cpu_smoke else "7b"
    tmp = Path(args.tmp) / f"len{length}"
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    recs = [SimpleNamespace(input_ids=[0] * length) for _ in range(warmup + steps)]
    t0 = time.perf_counter()
    model_dir, data, lens = write_worker_inputs(tmp, shape, recs)
    result = {"length": length, "data_s": round(time.perf_counter() - t0, 1), "record_lengths": sorted(set(lens))}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "training.finetune", "--model_name_or_path", str(model_dir), "--random_init",
           "--data_path", str(data), "--output_dir", str(tmp / "out"), "--max_steps", str(warmup + steps),
           "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "1",
           "--model_max_length", str(max(lens)), "--packing_tokens", str(max(lens)), "--gradient_checkpointing",
           "--use_lora", "--lora_r", "64", "--lora_alpha", "16", "--lora_dropout", "0.05",
           "--learning_rate", "1e-4", "--save_strategy", "no", "--logging_steps", "1", "--seed", "42",
           "--no_overlap_steps"]
    cmd += ["--use_cpu", "--tiled_mlp", "--tiled_mlp_tokens", "64"] if args.cpu_smoke else ["--bf16"]
    cmd += args.worker_args
    t0 = time.perf_counter()
    with open(log_path, "a") as log:
        log.write(f"===== {length} tokens: {' '.join(cmd)}\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    result["worker_wall_s"] = round(time.perf_counter() - t0, 1)
    metrics = tmp / "out" / "metrics.jsonl"
    recs_out = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
    step_recs = [r for r in recs_out if "event" not in r]
    start = next((r for r in recs_out if r.get("event") == "start"), {})
    fp = start.get("fast_path", {})
    result.update(tiled_mlp=fp.get("why", {}).get("tiled_mlp"), attention=fp.get("attention"),
                  loss=fp.get("ce"), gradient_checkpointing=fp.get("gradient_checkpointing"))
    if rc != 0 or len(step_recs) < warmup + steps:
        this_run = log_path.read_text().split(f"===== {length} tokens:")[-1]
        oom = any(m in this_run for m in OOM_MARKERS)
        result.update(status="OOM" if oom else f"failed rc={rc}",
                      error=" | ".join(this_run.strip().splitlines()[-3:])[-600:])
        return result
    timed = step_recs[warmup:]
    secs = sum(r["step_time"] for r in timed)
    tokens = sum(r["tokens"] for r in timed)
    f = flops_per_token(shape, "lora", float(length)) if shape != "tiny" else None
    result.update(status="ok", timed_steps=len(timed), step_s=round(secs / len(timed), 2),
                  tokens_per_s=round(tokens / secs, 1), peak_allocated_gib=max(r.get("peak_memory_gib") or 0.0
                                                                               for r in step_recs) or None,
                  mfu=round(tokens / secs * f / (PEAK_TFLOPS * 1e12), 4) if f else None,
                  first_loss=step_recs[0]["loss"], last_loss=step_recs[-1]["loss"])
    return result


def gpu_memory_gib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout.split()
        return float(out[0]) / 1024 if out else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def table(results: list[dict]) -> str:
    rows = ["| tokens | status | step s | tokens/s | MFU | peak alloc GiB | predicted GiB | tiled MLP |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "-"
        rows.append(f"| {r['length']:,} | {r['status']} | {r.get('step_s', '-')} | {r.get('tokens_per_s', '-')} | "
                    f"{mfu} | {r.get('peak_allocated_gib') or '-'} | {r.get('predicted_gib')} | "
                    f"{r.get('tiled_mlp') or '-'} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default=None, help=f"record lengths, ascending (default {DEFAULT_LENGTHS}; "
                   "--cpu-smoke: 256,512)")
    p.add_argument("--steps", type=int, default=1, help="timed steps a length (default 1)")
    p.add_argument("--warmup-below", type=int, default=100_000,
                   help="lengths below this get one untimed first step (default 100000)")
    p.add_argument("--budget-s", type=float, default=470.0, help="bound of the whole call in seconds (default 470)")
    p.add_argument("--cpu-smoke", action="store_true", help="the tiny shape on CPU: checks the harness, no figures")
    p.add_argument("--out", default=None, help="folder for results.json, results.md and worker.log")
    p.add_argument("--tmp", default="/tmp/long_context")
    p.add_argument("worker_args", nargs="*", help="after --: more worker flags (e.g. --attention_kernel flash)")
    args = p.parse_args(argv)
    lengths = [int(x) for x in (args.lengths or ("256,512" if args.cpu_smoke else DEFAULT_LENGTHS)).split(",")]
    if lengths != sorted(lengths):
        p.error("--lengths must ascend")
    out = Path(args.out or f"/tmp/long_context-{datetime.date.today()}")
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "worker.log"
    gib = None if args.cpu_smoke else gpu_memory_gib()
    t_start, results, last = time.perf_counter(), [], None
    for length in lengths:
        left = args.budget_s - (time.perf_counter() - t_start)
        warmup = 1 if length < args.warmup_below else 0
        # The last length's wall time, its step time scaled by the square of the length (attention dominates).
        guess = None
        if last is not None and last.get("step_s"):
            scale = (length / last["length"]) ** 2
            guess = (last["worker_wall_s"] - last["step_s"] * (last["timed_steps"] + last["warmup"])
                     + last["step_s"] * scale * (args.steps + warmup))
        res = {"length": length, **predicted(length, gib)}
        if left <= 30 or (guess is not None and guess > left):
            res.update(status="skipped", error=f"{left:.0f} s of the budget left, ~{guess or 0:.0f} s needed")
            results.append(res)
            print(json.dumps(res), flush=True)
            continue
        res.update(run_length(length, args.steps, warmup, args, log_path, timeout=max(left - 5, 30)), warmup=warmup)
        results.append(res)
        print(json.dumps(res), flush=True)
        if res["status"] == "OOM":
            break
        if res["status"] == "ok":
            last = res
    ok = [r for r in results if r["status"] == "ok"]
    summary = {"date": str(datetime.date.today()), "gpu_memory_gib": gib, "cpu_smoke": args.cpu_smoke,
               "longest_trained": max((r["length"] for r in ok), default=None),
               "tokens_per_s_at_longest": ok[-1]["tokens_per_s"] if ok else None,
               "wall_s": round(time.perf_counter() - t_start, 1), "results": results}
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    (out / "results.md").write_text(table(results) + "\n")
    print(table(results))
    print(f"longest trained: {summary['longest_trained']} tokens at {summary['tokens_per_s_at_longest']} tokens/s "
          f"({summary['wall_s']} s)")
    return 0 if ok else 3


if __name__ == "__main__":
    raise SystemExit(main())
