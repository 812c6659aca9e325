"""The Run screen's load monitor over SSH on the namespace cluster: ONE long-lived
stream per node (SSHTransport.stream_lines, one exec channel under a pty), about one
sample a second, exactly one remote process per node while it runs, and none left
once it stops. No GPU is faked on the nodes: they are CPU-only, so the CPU loop runs."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import pytest

from qwen_tui.nodes.connect import transport_for
from qwen_tui.nodes.transport.protocol import TransportError
from qwen_tui.run.watch import gpumon


def _cmdlines(cluster, i: int) -> dict[int, bytes]:
    """Live processes in node i's namespace other than sshd: pid -> cmdline."""
    out = {}
    for pid in cluster.job_pids(i):
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # ended between the listing and the read
    return out


def _samplers(cluster, i: int, mark: bytes = gpumon.CPU_LOOP_MARK.encode()) -> list[int]:
    return [pid for pid, cmd in _cmdlines(cluster, i).items() if mark in cmd]


def _wait_until(pred, bound: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


@pytest.fixture
def transports(preset):
    ts = {i: transport_for(n, preset) for i, n in enumerate(preset.cluster.nodes)}
    try:
        yield ts
    finally:
        for t in ts.values():
            t.close()


def test_cpu_load_stream_one_process_per_node(cluster, preset, transports):
    n = len(preset.cluster.nodes)
    before = {i: set(_cmdlines(cluster, i)) for i in range(n)}
    assert not any(_samplers(cluster, i) for i in range(n))
    got: dict[int, list[tuple[float, gpumon.NodeSample]]] = {i: [] for i in range(n)}
    lock = threading.Lock()

    def on(s: gpumon.NodeSample) -> None:
        with lock:
            got[s.rank].append((time.monotonic(), s))

    mon = gpumon.GpuMonitor(transports, on, gpu_nodes={i: False for i in range(n)},
                            pythons={i: nd.python for i, nd in enumerate(preset.cluster.nodes)})
    mon.start()
    try:
        assert _wait_until(lambda: all(len(v) >= 2 for v in got.values()), 20), got
        # exactly one remote process per node serves the stream, and nothing else was started
        for i in range(n):
            new = {p: c for p, c in _cmdlines(cluster, i).items() if p not in before[i]}
            assert len(_samplers(cluster, i)) == 1, new
            assert len(new) == 1, new
        time.sleep(4.2)
        for i in range(n):
            assert len(_samplers(cluster, i)) == 1  # still the same one stream, no poll processes
    finally:
        mon.stop()
    assert not any(th.is_alive() for th in mon._threads)
    for i in range(n):
        samples = [s for _, s in got[i]]
        assert all(s.error is None for s in samples), [s.error for s in samples if s.error]
        assert all(s.cpu_only and 0 <= s.cpu_util_pct <= 100 and s.cpu_count for s in samples)
        times = [t for t, _ in got[i]]
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert len(samples) >= 5, (i, len(samples))
        assert 0.8 <= statistics.median(gaps) <= 1.3 and min(gaps) >= 0.5, (i, gaps)
    # after stop: no sampler left on any node (the pty hang-up ends it), nothing else either
    assert _wait_until(lambda: not any(_samplers(cluster, i) for i in range(n)), 10), \
        {i: _samplers(cluster, i) for i in range(n)}
    for i in range(n):
        assert set(_cmdlines(cluster, i)) <= before[i]


def test_stream_lines_closing_early_ends_the_remote_command(cluster, preset, transports):
    t = transports[1]
    stop = threading.Event()
    mark = "qwen-tui-stream-test"
    argv = [preset.cluster.nodes[1].python, "-u", "-c",
            f"import time  # {mark}\nwhile True:\n    print('tick', flush=True); time.sleep(0.2)"]
    it = t.stream_lines(argv, stop=stop, timeout_first_line=10)
    lines = [next(it) for _ in range(3)]
    assert lines == ["tick"] * 3  # the pty's \r\n is gone
    assert len(_samplers(cluster, 1, mark.encode())) == 1
    it.close()  # the consumer walks away: the channel closes, the command is hung up
    assert _wait_until(lambda: not _samplers(cluster, 1, mark.encode()), 10)
    # the connection is still good for the next command
    assert t.run(["true"], timeout=10).ok


def test_stream_lines_stop_and_first_line_bounds(cluster, preset, transports):
    t = transports[2]
    stop = threading.Event()
    mark = "qwen-tui-silent-test"
    argv = [preset.cluster.nodes[2].python, "-c", f"import time  # {mark}\ntime.sleep(60)"]
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="no output within"):
        list(t.stream_lines(argv, stop=stop, timeout_first_line=1.5))
    assert time.monotonic() - t0 < 5
    assert _wait_until(lambda: not _samplers(cluster, 2, mark.encode()), 10)
    # stop set from another thread ends a silent stream without an error, promptly
    threading.Timer(1.0, stop.set).start()
    t0 = time.monotonic()
    assert list(t.stream_lines(argv, stop=stop, timeout_first_line=30)) == []
    assert time.monotonic() - t0 < 3
    assert _wait_until(lambda: not _samplers(cluster, 2, mark.encode()), 10)
    # a command that ends by itself ends the stream (its last line without a newline too)
    stop.clear()
    out = list(t.stream_lines(["printf", "a\\nb\\nc"], stop=stop, timeout_first_line=10))
    assert out == ["a", "b", "c"]


def test_stream_lines_keeps_the_output_that_follows_the_exit_status(cluster, preset, transports):
    """sshd can report the exit status before the last output: a command that prints
    a lot and exits at once must still reach the consumer whole."""
    t = transports[1]
    stop = threading.Event()
    for _ in range(3):
        out = list(t.stream_lines(["seq", "1", "30000"], stop=stop, timeout_first_line=10))
        assert out == [str(i) for i in range(1, 30001)]
    # a child that keeps the pty open does not hold the stream past the grace
    t0 = time.monotonic()
    out = list(t.stream_lines(["sh", "-c", "echo done; sleep 20 &"], stop=stop, timeout_first_line=10))
    assert out[:1] == ["done"]
    assert time.monotonic() - t0 < 15
