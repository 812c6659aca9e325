"""Recovery on the namespace cluster, the way users run it: `qwen-tui replay --exclude-failed` with
`training.restarts: 1`; node 2's torchrun agent and ranks are killed mid-run, and the two nodes left
finish the run from the last checkpoint with the same global batch while the loss keeps falling.
Under DeepSpeed ZeRO-2 (Qwen's multi-node recipe), whose checkpoint of 3 processes the 2 left resume through
DeepSpeed's universal format, taking up the curve where the failed attempt had it. Plain DDP goes through the
same launcher, relaunch and batch re-split; its checkpoint resuming on fewer processes is
tests/training/test_resume_other_world.py's DDP case, and DDP recovery through replay is
tests/launch/test_restarts_local.py's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwen_tui.preset.files import save_preset
from qwen_tui.preset.schema import Preset
from support.cluster import REPO, preset_dict

MAX_STEPS, SAVE_STEPS = 14, 4


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _job_parts(cluster, i: int) -> dict[str, list[int]]:
    """Node i's run: its job shell, its torchrun agent and the agent's ranks."""
    procs = {pid: _cmdline(pid) for pid in cluster.job_pids(i)}
    shell = [p for p, c in procs.items() if c.startswith(b"sh\0")]
    agent = [p for p, c in procs.items() if p not in shell and b"torch.distributed.run" in c]
    ranks = [p for p, c in procs.items() if p not in shell + agent and b"training" in c]
    return {"shell": shell, "agent": agent, "ranks": ranks}


def _records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def _wait(what, cond, bound, proc, log, every=0.5):
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        assert proc.poll() is None, f"replay ended (rc {proc.returncode}) before {what}:\n{log.read_text()[-3000:]}"
        time.sleep(every)
    raise AssertionError(f"no {what} within {bound}s:\n{log.read_text()[-3000:]}")


def test_a_node_killed_mid_run_is_left_out_and_the_others_finish_from_the_checkpoint(cluster, sshdir, keyed,
                                                                                      tmp_path):
    d = preset_dict(cluster, sshdir, output_dir=str(tmp_path / "out"), max_steps=MAX_STEPS, save_strategy="steps",
                    save_steps=SAVE_STEPS, save_total_limit=None, learning_rate=5e-3, logging_steps=1,
                    per_device_train_batch_size=2, gradient_accumulation_steps=1, restarts=1,
                    zero_stage=2, lora_dropout=0.0)  # no dropout: the curve repeats exactly
    d["name"] = "restarts"
    d["network"]["env"] = {"OMP_NUM_THREADS": "1"}  # three CPU "nodes" share two cores
    # DeepSpeed's CPU op, built once for the test session (tests/conftest.py's cache)
    d["network"]["env"]["TORCH_EXTENSIONS_DIR"] = os.environ.get("TORCH_EXTENSIONS_DIR") or str(
        Path(os.environ.get("QWEN_TUI_TEST_CACHE") or "/tmp/qwen-tui-test-cache") / "torch_extensions")
    d["network"]["interface"] = "eth0"  # --skip-checks: no probe to find it
    d["cluster"]["shared_storage"] = True
    preset = tmp_path / "restarts.yaml"
    save_preset(Preset.model_validate(d), preset)
    runs, log = tmp_path / "runs", tmp_path / "replay.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "qwen_tui.cli", "replay", str(preset), "--skip-checks",
                                 "--exclude-failed", "--runs-dir", str(runs)], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    rd = None
    try:
        rd = _wait("run directory", lambda: next(iter(runs.glob("*/plan.json")), None), 60, proc, log).parent
        # The worker's own record in node 0's run directory under its workdir, not replay's copy (that one lags):
        # a tiny model steps every ~40 ms here, so a kill aimed from a lagging view can land after the last step.
        live = REPO / ".qwen-tui" / "runs" / rd.name / "metrics.jsonl"
        _wait("the worker's start record", lambda: any(r.get("event") == "start" for r in _records(live)), 300,
              proc, log, every=0.01)
        master = _job_parts(cluster, 0)["ranks"]
        assert master, "no rank on node 0 after its start record"

        def after_a_checkpoint():
            recs = _records(live)
            ck = [r["step"] for r in recs if r.get("event") == "checkpoint"]
            steps = [r["step"] for r in recs if "loss" in r and "event" not in r]
            return ck and steps and max(steps) > ck[-1] and (ck[-1], max(steps))

        frozen = []
        try:
            deadline = time.monotonic() + 300
            while not (seen := after_a_checkpoint()):
                assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.01)
            # hold the run still where it was seen: node 0's rank stopped, the others wait in its next collective
            for pid in master:
                os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)
            first_ckpt, at_step = seen
            assert at_step < MAX_STEPS, f"the run had reached step {at_step} of {MAX_STEPS} before the kill"
            # kill node 2's torchrun agent and its ranks (its job shell stays and writes the exit code)
            parts = _job_parts(cluster, 2)
            assert len(parts["agent"]) == 1 and parts["ranks"], parts
            for pid in parts["agent"] + parts["ranks"]:
                os.kill(pid, signal.SIGKILL)
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        rc = proc.wait(timeout=400)
        text = log.read_text()
        assert rc == 0, text[-4000:]

        state = json.loads((rd / "state.json").read_text())
        assert state["status"] == "ok" and state["attempt"] == 2, state
        a1, a2 = state["attempts"]
        node2 = d["cluster"]["nodes"][2]["host"]
        assert a1["status"] == "failed" and a1["failed_node"] == node2 and a1["next"] == "restart", a1
        assert a1["world_size"] == 3 and len(a1["nodes"]) == 3
        assert a2["status"] == "ok" and a2["excluded"] == [node2] and a2["world_size"] == 2, a2
        assert node2 not in a2["nodes"]
        # 6 = 2 x 1 x 3 GPUs before; 3 per process now: 1 x 3
        assert a2["batch"] == "1 per device x 3 accumulation x 1 GPUs per node x 2 nodes = 6", a2
        resumed = int(a2["resume_from"].rsplit("-", 1)[1])
        assert resumed >= first_ckpt and resumed % SAVE_STEPS == 0, (a2, first_ckpt)
        # the live view said so, and why: the failed node of attempt 1
        assert "attempt 2 of 2; after node 2 (" in text and f"; without {node2}; resumed from" in text

        # one metrics record for both attempts, kept in the run directory
        recs = _records(rd / "metrics.jsonl")
        starts = [r for r in recs if r.get("event") == "start"]
        assert [s["world_size"] for s in starts] == [3, 2], starts
        assert starts[1]["start_step"] == resumed and starts[1]["global_batch_size"] == 6
        assert starts[1]["gradient_accumulation_steps"] == 3 and starts[1]["resumed_from"]
        end = [r for r in recs if r.get("event") == "end"]
        assert end and end[-1]["status"] == "ok" and end[-1]["step"] == MAX_STEPS, end
        i2 = recs.index(starts[1])
        later = [r for r in recs[i2:] if "loss" in r and "event" not in r]
        assert [r["step"] for r in later] == list(range(resumed + 1, MAX_STEPS + 1)), later
        losses = [r["loss"] for r in recs[:i2] if "loss" in r and "event" not in r] + [r["loss"] for r in later]
        assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.01, losses
        # 3 processes' ZeRO-2 state resumed on 2: converted once, and the steps both attempts trained agree
        assert starts[1]["zero_stage"] == 2 and (tmp_path / "out" / f"checkpoint-{resumed}" / "universal").is_dir()
        first = {r["step"]: r["loss"] for r in recs[:i2]
                 if "loss" in r and "event" not in r and r["step"] > resumed}
        again = {r["step"]: r["loss"] for r in later}
        assert first, (resumed, recs[:i2])  # the kill came after a step past the newest checkpoint
        for step, loss in first.items():
            assert again[step] == pytest.approx(loss, rel=1e-3), (step, first, again)
        assert (tmp_path / "out" / f"checkpoint-{MAX_STEPS - MAX_STEPS % SAVE_STEPS}").is_dir()

        # `qwen-tui runs` shows the attempt
        ls = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "runs", "--json", "--runs-dir", str(runs)],
                            capture_output=True, text=True, timeout=60, env=env)
        (row,) = json.loads(ls.stdout)
        assert row["attempt"] == 2 and f"without {node2}" in row["attempt_note"], row
        assert row["step"] == MAX_STEPS and row["nodes"] == a2["nodes"]
        left = {i: cluster.job_pids(i) for i in range(3)}
        assert not any(left.values()), left
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # replay stops every node on SIGINT
            proc.wait(timeout=60)
        if rd is not None:
            shutil.rmtree(REPO / ".qwen-tui" / "runs" / rd.name, ignore_errors=True)
