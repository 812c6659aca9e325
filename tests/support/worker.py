"""Helpers for the worker's tests: data files, a subprocess runner, metrics parsing, reload-and-evaluate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support.paths import ROOT
from support.ports import free_port


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def demo_records(n: int | None = None) -> list[dict]:
    from training.demo_data.make_demo_chat import build

    return build()[:n] if n else build()


def parsed_flags(argv=()):
    """The worker's flags (WorkerFlags) as argparse reads these (the required ones filled in), before parse_args
    resolves and checks them."""
    from training.args import build_parser
    from training.flags import WorkerFlags

    base = ["--model_name_or_path", "m", "--data_path", "d", "--output_dir", "o"]
    return WorkerFlags.from_namespace(build_parser().parse_args(base + list(argv)))


def decide_for(argv=(), device: str = "cpu", deepspeed: bool = False, zero_stage: int = 2):
    """training.fast.choice.decide for these worker flags (the required ones filled in) on this device type."""
    import torch

    from training.fast.choice import decide

    flags = parsed_flags(argv)
    return decide(flags.fast, flags.lora, half=bool(flags.train.bf16 or flags.train.fp16), device=torch.device(device),
                  deepspeed=deepspeed, zero_stage=zero_stage, expandable=flags.fast.expandable_segments)


def run_interpreted(script: str, timeout: float = 600) -> dict:
    """Runs a Python script under Triton's CPU interpreter (TRITON_INTERPRET=1: Triton kernels on CPU tensors) in
    a fresh process, and returns the JSON object its last output line prints."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    out: Path

    @property
    def records(self) -> list[dict]:
        return [json.loads(line) for line in (self.out / "metrics.jsonl").read_text().splitlines()]

    @property
    def steps(self) -> list[dict]:
        return [r for r in self.records if "event" not in r]

    def event(self, name: str) -> list[dict]:
        return [r for r in self.records if r.get("event") == name]

    def losses(self) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in self.steps}


def one_process_threads() -> str:
    """Threads for a one-process run: the suite's setting where it has one (one a process on the parallel
    workers, which share the cores: tests/conftest.py), else both cores."""
    return os.environ.get("OMP_NUM_THREADS", "2")


def run_worker(out: Path, *flags: str, nproc: int = 1, timeout: int = 420) -> Run:
    """Runs the worker as users do: `python -m training.finetune`, or torchrun for several processes."""
    if nproc == 1:
        cmd = [sys.executable, "-m", "training.finetune"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "training.finetune"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1" if nproc > 1 else one_process_threads()}
    res = subprocess.run([*cmd, "--output_dir", str(out), *flags], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout)
    return Run(res.returncode, res.stdout, res.stderr, out)


def assert_ok(run: Run) -> None:
    assert run.rc == 0, f"exit {run.rc}\n--- stdout\n{run.stdout[-3000:]}\n--- stderr\n{run.stderr[-6000:]}"


def eval_loss_of(model, tokenizer, data_path: str, max_length: int = 8192) -> float:
    """Token-mean loss of a reloaded model on a data file, through the worker's own data path."""
    import torch

    from training.data.batches import Collator, build_dataset
    from training.data.encoding import IGNORE_INDEX, ChatEncoder
    from training.data.records import load_conversations

    ds = build_dataset(load_conversations(data_path), ChatEncoder(tokenizer, max_length), lazy=False)
    col = Collator(tokenizer.pad_token_id)
    total = n = 0.0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(ds), 8):
            b = col([ds[j] for j in range(i, min(i + 8, len(ds)))])
            out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"],
                        num_items_in_batch=torch.tensor(1.0))
            total += out.loss.item()
            n += int((b["labels"] != IGNORE_INDEX).sum())
    return total / n
