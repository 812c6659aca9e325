"""A real 2-process torchrun run with --heartbeat_dir, and real faults injected into it while it trains: SIGUSR1 to
one rank (its stacks land in its stack file), then SIGSTOP to the other for a while (its heartbeat stops, the
other's goes on; the metrics record of that step shows the stopped rank computing and the other waiting)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.paths import ROOT
from support.ports import free_port
from support.worker import demo_records, write_jsonl

pytestmark = pytest.mark.slow

FIELDS = {"rank", "local_rank", "node_rank", "world_size", "pid", "host", "step", "phase", "phase_since", "time",
          "compute_s", "wait_s", "step_time"}
MAX_STEPS = 24
STOP_S = 1.5


@dataclass
class Watched:
    rc: int
    log: str
    out: Path
    hb: Path
    stack_text: str = ""
    stopped_in_step: int = 0  # the step rank 1 was in when it was stopped
    frozen: list = field(default_factory=list)  # [(rank-0 time, rank-1 time)] read during the stop

    @property
    def steps(self) -> list[dict]:
        recs = [json.loads(line) for line in (self.out / "metrics.jsonl").read_text().splitlines()]
        return [r for r in recs if "event" not in r]


def _beat(hb: Path, rank: int) -> dict | None:
    try:
        return json.loads((hb / f"rank-{rank}.json").read_text())
    except FileNotFoundError:
        return None


def _until(proc, cond, timeout: float, what: str, poll: float = 0.002):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(poll)


def _drive(proc, w: Watched) -> None:
    hb = w.hb
    _until(proc, lambda: all((b := _beat(hb, r)) and b["step"] >= 2 for r in (0, 1)), 300, "step 2 on both ranks",
           poll=0.05)
    # SIGUSR1 to a running rank: its stacks, the step loop among them, land in its stack file.
    os.kill(_beat(hb, 0)["pid"], signal.SIGUSR1)
    stack = hb / "stack-rank-0.txt"
    w.stack_text = _until(proc, lambda: "=== end of stacks" in stack.read_text() and stack.read_text(), 30,
                          "a closed stack dump")
    # SIGSTOP rank 1 early in a step, in its forward pass: its own work, far from the step's synchronising end (a
    # stop there would hold both ranks in the same wait, and neither would be the one computing).
    seen_step, seen_at, period = None, 0.0, 0.0
    while True:
        b = _until(proc, lambda: _beat(hb, 1), 10, "rank 1's heartbeat")
        assert b["step"] < MAX_STEPS - 5, "rank 1 was never caught early in a step's forward"
        if b["step"] != seen_step:
            now = time.monotonic()
            period = now - seen_at if seen_step is not None and b["step"] == seen_step + 1 else 0.0
            seen_step, seen_at = b["step"], now
        elif b["phase"] == "forward" and time.monotonic() - seen_at < min(0.1, 0.3 * period):
            pid = b["pid"]
            os.kill(pid, signal.SIGSTOP)
            break
        time.sleep(0.002)
    try:
        w.stopped_in_step = seen_step + 1
        time.sleep(0.3)
        w.frozen.append((_beat(hb, 0)["time"], _beat(hb, 1)["time"]))
        time.sleep(STOP_S - 0.3)
        w.frozen.append((_beat(hb, 0)["time"], _beat(hb, 1)["time"]))
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def watched(tmp_path_factory, tiny_model) -> Watched:
    tmp = tmp_path_factory.mktemp("watched")
    data = write_jsonl(tmp / "chat.jsonl", demo_records())
    # Packed rows of 128 tokens, 48 records a step: some 25 micro-batches a step, ~0.3-0.6 s on CPU, so rank 1 can
    # be caught early in one. The heartbeat is written every 10 ms to follow it that closely.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "training.finetune",
           "--model_name_or_path", str(tiny_model), "--data_path", str(data), "--output_dir", str(tmp / "out"),
           "--use_cpu", "--use_lora", "--max_steps", str(MAX_STEPS), "--save_strategy", "no", "--logging_steps", "1",
           "--tokenized_cache_dir", "none", "--per_device_train_batch_size", "24", "--gradient_accumulation_steps",
           "2", "--model_max_length", "128", "--packing_tokens", "128", "--seed", "7",
           "--heartbeat_dir", "hb", "--heartbeat_interval", "0.01"]  # relative: to the working directory
    log = tmp / "torchrun.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=tmp, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                                stdout=f, stderr=subprocess.STDOUT, text=True)
    w = Watched(rc=-1, log="", out=tmp / "out", hb=tmp / "hb")
    try:
        _drive(proc, w)
        w.rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        w.log = log.read_text()
    assert w.rc == 0, w.log[-5000:]
    return w


def test_every_rank_keeps_a_heartbeat_that_ends_done_at_the_last_step(watched):
    for rank in (0, 1):
        b = _beat(watched.hb, rank)
        assert set(b) == FIELDS, b
        assert b["rank"] == rank and b["local_rank"] == rank and b["node_rank"] == 0 and b["world_size"] == 2
        assert b["step"] == MAX_STEPS and b["phase"] == "done", b
        assert b["phase_since"] <= b["time"]
        assert b["compute_s"] > 0 and b["wait_s"] >= 0 and b["step_time"] > 0
        assert b["compute_s"] + b["wait_s"] == pytest.approx(b["step_time"], rel=1e-6)
    assert not list(watched.hb.glob(".*.tmp"))


def test_metrics_records_carry_each_ranks_compute_and_wait(watched):
    steps = watched.steps
    assert [r["step"] for r in steps] == list(range(1, MAX_STEPS + 1))
    for r in steps:
        assert len(r["rank_compute_s"]) == len(r["rank_wait_s"]) == 2 and r["rank_node"] == [0, 0], r
        assert min(r["rank_compute_s"]) > 0 and min(r["rank_wait_s"]) >= 0, r
        # Rank 0's figures add up to the step time it logs; rank 1's to its own, which differs from rank 0's only
        # by where each one's step began: the loss all-reduce ends every step together, and the next one starts
        # after rank 0 has written its record. The first step starts when each rank's own set-up is done.
        assert r["rank_compute_s"][0] + r["rank_wait_s"][0] == pytest.approx(r["step_time"], rel=1e-6), r
        if r["step"] > 1:
            assert r["rank_compute_s"][1] + r["rank_wait_s"][1] == pytest.approx(r["step_time"], abs=0.1,
                                                                                  rel=0.25), r


def test_a_stopped_rank_stops_its_heartbeat_while_the_other_keeps_writing(watched):
    (t0_a, t1_a), (t0_b, t1_b) = watched.frozen
    assert t1_b == t1_a, "the stopped rank's heartbeat was still written"
    assert t0_b > t0_a + 0.5, "the running rank's heartbeat stopped too"


def test_the_record_of_the_stopped_step_shows_who_computed_and_who_waited(watched):
    rec = next(r for r in watched.steps if r["step"] == watched.stopped_in_step)
    compute, wait = rec["rank_compute_s"], rec["rank_wait_s"]
    assert rec["step_time"] > STOP_S, rec
    assert compute[1] > compute[0] + 0.5 * STOP_S, rec  # the stopped rank: its time went into its own step
    assert wait[0] > wait[1] + 0.5 * STOP_S, rec  # the other one waited for it


def test_sigusr1_writes_the_ranks_stacks_to_its_stack_file_and_the_log(watched):
    text = watched.stack_text
    assert text.startswith("=== stacks of rank 0 (pid ")
    assert "step_loop.py" in text and " in _train_loop" in text, text[-3000:]
    assert "stacks on SIGUSR1 (also in " in watched.log and " in _train_loop" in watched.log
