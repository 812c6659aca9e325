"""The monitor's per-node series handed to the worker's trackers (qwen_tui.run.watch.gpuseries), read back by the
worker's own reader (training.trackers.NodeGpuFeed): real nvidia-smi output in, the logged figures out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.run.watch.gpumon import NodeSample
from qwen_tui.run.watch.gpuseries import GpuSeriesWriter, reports_to_tracker, series_path
from support.gpu_stream import stream_ticks
from training.runtime.trackers import NodeGpuFeed


def test_writer_appends_one_mean_line_per_node_and_the_worker_reads_it(tmp_path):
    path = str(tmp_path / "run" / "gpus.jsonl")
    (tmp_path / "run").mkdir()
    w = GpuSeriesWriter(LocalTransport(), path, {0: "gpu-a", 1: "cpu-b"}, clock=lambda: 1000.0)
    ticks = stream_ticks()
    assert len(ticks) == 6
    for tick in ticks:
        w.add(NodeSample(rank=0, gpus=tick))
    w.add(NodeSample(rank=1, cpu_util_pct=80.0, load1=1.0))
    w.add(NodeSample(rank=1, cpu_util_pct=60.0, load1=1.0))
    w.add(NodeSample(rank=2, error="TransportError: node went away"))  # nothing to say: no line
    assert w.flush() == 2
    lines = [json.loads(x) for x in Path(path).read_text().splitlines()]
    utils = [t[0].util_pct for t in ticks]
    assert lines[0] == {"time": 1000.0, "node": 0, "label": "gpu-a", "samples": 6,
                        "gpus": [{"index": 0, "util": pytest.approx(sum(utils) / 6), "mem_used_mib": 1139.0,
                                  "mem_total_mib": 143771.0}]}
    assert lines[1] == {"time": 1000.0, "node": 1, "label": "cpu-b", "samples": 2, "cpu_util": 70.0}
    assert w.flush() == 0  # the window was emptied

    feed = NodeGpuFeed(path)
    assert feed.since_last() == {"gpu/node0/gpu0/util": pytest.approx(sum(utils) / 6),
                                 "gpu/node0/gpu0/mem_used_gib": pytest.approx(1139 / 1024),
                                 "cpu/node1/util": 70.0}
    assert feed.since_last() == {}  # only what is new
    w.add(NodeSample(rank=1, cpu_util_pct=10.0))
    w.flush()
    assert feed.since_last() == {"cpu/node1/util": 10.0}


def test_feed_waits_for_a_line_being_written_and_skips_torn_ones(tmp_path):
    path = tmp_path / "gpus.jsonl"
    feed = NodeGpuFeed(str(path))
    assert feed.since_last() == {}  # no qwen-tui following the run: no file, nothing logged
    path.write_text('{"node": 0, "cpu_util": 50}\n{"node": 0, "cpu_u')
    assert feed.since_last() == {"cpu/node0/util": 50.0}
    with open(path, "a") as f:
        f.write('til": 70}\nnot json\n{"node": "x", "cpu_util": 1}\n')
    assert feed.since_last() == {"cpu/node0/util": 70.0}


def test_a_failed_append_drops_the_window_and_says_why(tmp_path):
    w = GpuSeriesWriter(LocalTransport(), str(tmp_path / "missing-dir" / "gpus.jsonl"))
    w.add(NodeSample(rank=0, cpu_util_pct=5.0))
    assert w.flush() == 0
    assert "missing-dir" in w.last_error or "No such file" in w.last_error
    assert w.lines_written == 0


def test_writer_thread_flushes_on_its_own_and_at_stop(tmp_path):
    path = tmp_path / "gpus.jsonl"
    w = GpuSeriesWriter(LocalTransport(), str(path), interval=0.2)
    w.start()
    w.add(NodeSample(rank=0, cpu_util_pct=5.0))
    import time

    deadline = time.monotonic() + 10
    # the file exists as soon as `cat >>` opens it, before its line is written: wait for the line
    while not (path.exists() and path.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.read_text().count("\n") == 1
    w.add(NodeSample(rank=0, cpu_util_pct=7.0))
    w.stop()
    assert path.read_text().count("\n") == 2 and w.lines_written == 2


def test_which_runs_get_the_series():
    assert reports_to_tracker(["python", "-m", "training.finetune", "--report_to", "tensorboard,wandb"])
    assert reports_to_tracker(["--report_to=wandb"])
    assert not reports_to_tracker(["--report_to", "none"])
    assert not reports_to_tracker(["--output_dir", "x"])
    assert series_path("/w/.qwen-tui/runs/r1/metrics.jsonl") == "/w/.qwen-tui/runs/r1/gpus.jsonl"


def test_a_nodes_first_samples_go_out_at_once_even_when_they_come_after_the_first_flush(tmp_path):
    # node 1's sampler started a moment after node 0's: with one short first window its samples waited for the
    # next full interval, and a run of a few seconds never logged node 1's load (cpu/node1 absent in TensorBoard)
    import time

    path = tmp_path / "gpus.jsonl"
    w = GpuSeriesWriter(LocalTransport(), str(path), {0: "cpu-a", 1: "cpu-b"}, interval=30.0)
    w.start()
    try:
        w.add(NodeSample(rank=0, cpu_util_pct=5.0))
        time.sleep(1.5)  # past the old first window
        w.add(NodeSample(rank=1, cpu_util_pct=9.0))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5.0:
            nodes = {json.loads(ln)["node"] for ln in path.read_text().splitlines()} if path.exists() else set()
            if nodes == {0, 1}:
                break
            time.sleep(0.05)
        assert nodes == {0, 1} and time.monotonic() - t0 < 2.0, nodes
        feed = NodeGpuFeed(str(path))
        assert feed.since_last() == {"cpu/node0/util": 5.0, "cpu/node1/util": 9.0}
    finally:
        w.stop(flush_last=False)
