"""The heartbeat writer, the SIGUSR1 stack file, the NCCL flight-recorder defaults and the step timer, in-process."""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import signal
import threading
import time

import pytest

from training.args import parse_args
from training.runtime import dist
from training.runtime.errors import InputError
from training.runtime.heartbeat import PHASES, Heartbeat, NoHeartbeat, from_flags
from training.runtime.stacks import StackFile

FIELDS = {"rank", "local_rank", "node_rank", "world_size", "pid", "host", "step", "phase", "phase_since", "time",
          "compute_s", "wait_s", "step_time"}


def _read(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _wait_for(cond, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.01)


def test_the_file_has_every_field_follows_the_loop_and_ends_done(tmp_path):
    hb = Heartbeat(str(tmp_path), 0.02, rank=3, local_rank=1, node_rank=1, world_size=4).start()
    try:
        first = _read(tmp_path / "rank-3.json")
        assert set(first) == FIELDS
        assert (first["rank"], first["local_rank"], first["node_rank"], first["world_size"]) == (3, 1, 1, 4)
        assert first["pid"] == os.getpid() and first["phase"] == "start" and first["step"] == 0
        assert first["compute_s"] is None and first["wait_s"] is None and first["step_time"] is None
        hb.phase("backward")
        since = time.time()
        hb.step = 7
        hb.figures(0.25, 0.05, 0.3)
        _wait_for(lambda: _read(tmp_path / "rank-3.json")["phase"] == "backward", what="phase backward")
        rec = _read(tmp_path / "rank-3.json")
        assert rec["step"] == 7 and (rec["compute_s"], rec["wait_s"], rec["step_time"]) == (0.25, 0.05, 0.3)
        assert rec["phase_since"] <= since
        # The thread keeps writing while the phase stays: time moves on, phase_since does not.
        t1 = rec["time"]
        _wait_for(lambda: _read(tmp_path / "rank-3.json")["time"] > t1 + 0.05, what="fresher time")
        assert _read(tmp_path / "rank-3.json")["phase_since"] == rec["phase_since"]
    finally:
        hb.done()
    last = _read(tmp_path / "rank-3.json")
    assert last["phase"] == "done" and last["step"] == 7
    assert not any(t.name == "heartbeat" for t in threading.enumerate())
    time.sleep(0.1)  # stopped: nothing rewrites the file any more
    assert _read(tmp_path / "rank-3.json") == last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-3.json"]  # no temporary file left behind
    hb.close()  # idempotent


def test_readers_never_see_half_a_file(tmp_path):
    hb = Heartbeat(str(tmp_path), 0.001, rank=0, local_rank=0, node_rank=0, world_size=1).start()
    try:
        reads = 0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            hb.phase(PHASES[reads % len(PHASES)])
            rec = _read(tmp_path / "rank-0.json")  # a torn write would not parse
            assert set(rec) == FIELDS and rec["phase"] in PHASES
            reads += 1
        assert reads > 100
    finally:
        hb.close()


def test_a_write_that_fails_warns_once_and_stops_the_heartbeat_not_training(tmp_path, caplog):
    caplog.set_level("WARNING", logger="training")
    d = tmp_path / "hb"
    d.mkdir()
    hb = Heartbeat(str(d), 0.01, rank=0, local_rank=0, node_rank=0, world_size=1).start()
    shutil.rmtree(d)  # the directory goes away under the writer (as a full disk would fail it)
    _wait_for(lambda: hb._thread is not None and not hb._thread.is_alive(), what="heartbeat thread end")
    hb.phase("forward")  # the loop's calls go on working
    hb.done()
    warnings = [r for r in caplog.records if "heartbeat: cannot write" in r.getMessage()]
    assert len(warnings) == 1 and "training goes on" in warnings[0].getMessage()
    assert not d.exists()


def test_from_flags_without_a_directory_is_a_no_op_and_with_one_starts(tmp_path, monkeypatch):
    base = ["--model_name_or_path", "m", "--data_path", "d", "--output_dir", str(tmp_path / "o")]
    assert isinstance(from_flags(parse_args(base).save), NoHeartbeat)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("GROUP_RANK", "2")
    hb = from_flags(parse_args(base + ["--heartbeat_dir", "beats", "--heartbeat_interval", "0.5"]).save)
    try:
        rec = _read(tmp_path / "beats" / "rank-5.json")  # DIR relative to the working directory
        assert rec["rank"] == 5 and rec["node_rank"] == 2 and hb.interval == 0.5
    finally:
        hb.close()


def test_heartbeat_interval_must_be_positive():
    with pytest.raises(InputError, match="--heartbeat_interval must be positive"):
        parse_args(["--model_name_or_path", "m", "--data_path", "d", "--output_dir", "o", "--heartbeat_interval", "0"])


def _stacks_here():
    return os.getpid()


def test_sigusr1_appends_every_threads_stack_and_the_heartbeat_closes_and_copies_it(tmp_path, capfd):
    sf = StackFile(str(tmp_path), 2)
    try:
        path = tmp_path / "stack-rank-2.txt"
        head = path.read_text()
        assert head.startswith(f"=== stacks of rank 2 (pid {os.getpid()}") and head.count("\n") == 1
        os.kill(_stacks_here(), signal.SIGUSR1)  # answered by faulthandler's C handler, at once
        _wait_for(lambda: "most recent call first" in path.read_text(), what="stack dump")
        sf.check()
        text = path.read_text()
        assert "test_sigusr1_appends_every_threads_stack" in text  # this test's own frame
        assert text.rstrip().splitlines()[-1].startswith(f"=== end of stacks: rank 2 pid {os.getpid()} at ")
        sf.check()  # nothing new: nothing added
        assert path.read_text() == text
        assert "test_sigusr1_appends_every_threads_stack" in capfd.readouterr().err  # the log gets it too
    finally:
        faulthandler.unregister(signal.SIGUSR1)


def test_flight_recorder_defaults_leave_a_users_values_alone(monkeypatch, tmp_path):
    """Set under torch's current names (the older ones make every rank warn); a user's values under either name
    are left alone."""
    names = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
             "TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE")
    for name in names:
        monkeypatch.setenv(name, "")  # recorded, so that what the function sets is undone after the test too
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    dist.flight_recorder_defaults("beats")
    assert {n: os.environ.get(n) for n in names} == {
        "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "beats" / "nccl_trace_rank_"),
        "TORCH_NCCL_TRACE_BUFFER_SIZE": None, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": None}
    for name in names:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "0")  # the older names, a user's own
    monkeypatch.setenv("TORCH_NCCL_DUMP_ON_TIMEOUT", "0")
    monkeypatch.setenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/elsewhere/trace_")
    dist.flight_recorder_defaults("beats")
    assert {n: os.environ.get(n) for n in names} == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/elsewhere/trace_", "TORCH_FR_BUFFER_SIZE": None,
        "TORCH_FR_DUMP_TEMP_FILE": None}


def test_step_timer_sees_the_gradient_reach_layer_0_only_when_armed(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    from training.runtime.step_timing import StepTimer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    timer = StepTimer(torch.device("cpu"), model, several=True)
    assert timer.layer0 is model.model.layers[0]
    ids = torch.randint(0, 100, (2, 16))

    def backward(armed: bool, step: int):
        if armed:
            timer.arm()
        model(input_ids=ids, labels=ids).loss.backward()
        timer.disarm(step)

    backward(False, 1)
    assert timer.take(1) == 0.0  # not the synchronising micro-batch: nothing counted
    backward(True, 2)
    backward(True, 3)
    w2 = timer.take(2)
    assert 0.0 < w2 < 5.0
    timer.add_host_wait(3, 0.5)
    assert timer.take(2) == 0.0  # step 3's spans wait for step 3
    assert 0.5 < timer.take(3) < 5.5
    with torch.no_grad():  # evaluation: no gradient, no hook
        timer.arm()
        model(input_ids=ids)
        timer.disarm(4)
    assert timer.take(4) == 0.0
    assert StepTimer(torch.device("cpu"), model, several=False).layer0 is None  # one rank waits for nobody


@pytest.mark.slow
def test_step_timer_hook_works_on_compiled_layers(tiny_model):
    """The fast path compiles each decoder layer with its module hooks (CUDA's default): the forward hook on layer 0
    is traced into the compiled call, and the gradient hook it registers still fires in backward."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.fast.compile import compile_decoder_layers
    from training.runtime.step_timing import StepTimer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    timer = StepTimer(torch.device("cpu"), model, several=True)
    compile_decoder_layers(model, backend="aot_eager")
    for n, step in ((12, 1), (20, 2)):  # two widths: the dynamic graph and its hook serve both
        ids = torch.randint(0, 100, (1, n))
        timer.arm()
        model(input_ids=ids, labels=ids).loss.backward()
        timer.disarm(step)
        assert timer.take(step) > 0.0
