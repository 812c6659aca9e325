"""What every line of the GPU proof shares: its result and verdicts, its description, and the context it runs in
(its GPUs, the environment, the deadline, the log, the state lines pass on), and how it runs a command."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
VERDICTS = ("pass", "fail", "slow", "skipped")
SLOW_BELOW = 0.90  # a speed under 90% of the README's figure is flagged

# A small real-shaped model for the curve lines on GPUs: Qwen2.5-0.5B's public config.json (bench/train_speed.py
# builds it from SHAPES), random-init; on CPU the tiny built-in models.
GPU_SHAPE = "0.5b"
# Tolerances of a multi-GPU curve against one GPU's, step by step. On CPU (fp32) the suite's own; on GPUs the runs
# are bf16 under autocast with fp32 master weights, and the ranks' rows are packed differently, so the sums run in
# another order: looser, and to be confirmed by the first GPU call.
TOL = {"cpu": {"loss": 1e-3, "grad_norm": 1e-3}, "gpu": {"loss": 2e-2, "grad_norm": 5e-2}}


@dataclass
class Result:
    line: str
    title: str
    verdict: str
    detail: str
    measured: dict = field(default_factory=dict)
    reference: dict | None = None
    seconds: float = 0.0
    gpus: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {VERDICTS}")
        if self.verdict == "skipped" and not self.detail:
            raise ValueError(f"{self.line}: a skipped line must say why")

    def to_dict(self) -> dict:
        return {"line": self.line, "title": self.title, "verdict": self.verdict, "detail": self.detail,
                "measured": self.measured, "reference": self.reference, "seconds": round(self.seconds, 1),
                "gpus": self.gpus}


class LineFailed(Exception):
    """A line's run broke: its message is the verdict's detail."""


@dataclass
class Line:
    name: str
    title: str
    gpus: int  # GPUs it needs: 1, 2, or 0 for all of them (at least 2)
    gpu_only: bool  # True: needs CUDA; False: also runs on CPU ranks (--cpu)
    est_s: float  # seconds on an H200 machine, for the budget
    run: Callable[["Context"], Result]
    needs: tuple[str, ...] = ()  # modules it imports in the worker (a missing one skips it, naming the wheel)
    after: tuple[str, ...] = ()  # lines whose results it reads

    def want(self, total: int) -> int:
        return total if self.gpus == 0 else self.gpus


@dataclass
class Context:
    out: Path
    scratch: Path
    cpu: bool  # CPU ranks (gloo) instead of GPUs
    ngpus: int  # GPUs on the machine (0 with --cpu)
    deadline: float  # time.monotonic() by which everything must be done
    env: dict  # the environment every process of the proof gets
    log: Path
    results: dict = field(default_factory=dict)  # line name -> Result, as they finish
    shared: dict = field(default_factory=dict)  # what lines share (the one-rank reference runs, the nodes)
    gpu_ids: list[int] = field(default_factory=list)  # the GPUs of the line running now (set per line)
    carry: Path | None = None
    visible: list[str] = field(default_factory=list)  # the CUDA_VISIBLE_DEVICES the proof was given (empty: all)

    @property
    def ranks(self) -> int:
        """Processes a multi-process line runs: its GPUs, or 2 CPU ranks."""
        return 2 if self.cpu else len(self.gpu_ids)

    @property
    def kind(self) -> str:
        return "cpu" if self.cpu else "gpu"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def devices(self, ids: list[int] | None = None) -> str:
        """CUDA_VISIBLE_DEVICES for these of the proof's GPUs (default the line's), through the one it was given."""
        ids = self.gpu_ids if ids is None else ids
        return ",".join(self.visible[i] if self.visible else str(i) for i in ids)

    def line_env(self, **extra: str) -> dict:
        env = dict(self.env)
        if not self.cpu:
            env["CUDA_VISIBLE_DEVICES"] = self.devices()
        env.update(extra)
        return env

    def run(self, argv: list[str], *, timeout: float, env: dict | None = None, cwd: Path = ROOT,
            what: str = "", stdout_only: bool = False) -> subprocess.CompletedProcess:
        """Runs a command in its own session, its output appended to the proof's log (stdout_only: its stderr goes
        to the log alone, and stdout is what it printed there); on the timeout (or past the deadline) the whole
        session is killed and the line fails, saying so."""
        limit = max(5.0, min(timeout, self.left()))
        with open(self.log, "a") as log:
            log.write(f"===== {what or argv[0]}: {' '.join(argv)}\n")
            log.flush()
            p = subprocess.Popen(argv, cwd=cwd, env=env or self.line_env(), stdout=subprocess.PIPE,
                                 stderr=log if stdout_only else subprocess.STDOUT, text=True, start_new_session=True)
            try:
                out, _ = p.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate(timeout=30)
                log.write(out or "")
                raise LineFailed(f"{what or argv[0]} did not finish within {limit:.0f} s") from None
            log.write(out or "")
        return subprocess.CompletedProcess(argv, p.returncode, out or "", "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(ctx: Context, nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port())]


def tail(text: str, n: int = 3) -> str:
    return " | ".join(x.strip() for x in text.strip().splitlines()[-n:])[-500:]
