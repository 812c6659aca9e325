"""On a hang of a CUDA run the monitor asks each rank's NCCL flight recorder for a dump through the named pipe that
PyTorch's monitor thread reads (training/runtime/dist.py names it), and copies the dump next to the stacks
(run/watch/stacks.py). No NCCL here: a thread of this test stands in for PyTorch's side of the pipe (read it, write the
dump), through a real FIFO and the real local transport; a rank without a pipe is said so, and a pipe nobody reads
never holds the collection up."""

from __future__ import annotations

import os
import threading
import time

from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.plan.launch import NodeCommand
from qwen_tui.run.watch.stacks import FR_DUMP, FR_PIPE, flight_recorder
from training.runtime.dist import FR_PIPE_STEM


def test_a_dump_is_asked_through_each_ranks_pipe_and_copied_beside_the_stacks(tmp_path):
    assert FR_PIPE.format(3) == f"{FR_PIPE_STEM}3.pipe"  # the worker's name and the monitor's agree
    c = NodeCommand(rank=0, label="gpu-1", host="localhost", local=True, nproc=3, workdir=str(tmp_path),
                    run_dir=str(tmp_path / "run"), env={}, argv=["python3"])
    beat = tmp_path / "run" / "heartbeat"
    beat.mkdir(parents=True)
    os.mkfifo(beat / FR_PIPE.format(0))
    os.mkfifo(beat / FR_PIPE.format(2))  # rank 2's pipe is there but nobody reads it (its process is gone)

    def torch_side():
        with open(beat / FR_PIPE.format(0), "rb") as f:  # blocks until the monitor writes
            assert f.read(16)
        (beat / FR_DUMP.format(0)).write_bytes(b"\x80pickled entries")

    reader = threading.Thread(target=torch_side, daemon=True)
    reader.start()
    dest = tmp_path / "stacks"
    dest.mkdir()
    t0 = time.monotonic()
    said = flight_recorder(LocalTransport(), c, [0, 1, 2], dest, wait_s=3)
    reader.join(5)
    assert said[0] == "flight recorder dumped"
    assert (dest / "gpu-1-rank0.nccl_trace").read_bytes() == b"\x80pickled entries"
    assert said[1].startswith("no flight recorder pipe")
    assert said[2].startswith("no flight recorder pipe") or "wrote no dump" in said[2], said
    assert time.monotonic() - t0 < 15
