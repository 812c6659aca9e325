"""The GPU monitor's parsers on real nvidia-smi output (H200 fixtures) and the CPU sampler."""

from pathlib import Path

import pytest

from qwen_tui.run.watch import gpumon

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"
FULL = ("index", "name", "uuid", "pci.bus_id", "driver_version", "memory.total", "memory.used", "memory.free",
        "utilization.gpu", "utilization.memory", "temperature.gpu", "power.draw", "power.limit")



def test_busy_query_row():
    (g,) = gpumon.parse_query((FIX / "query_busy.csv").read_text(), FULL)
    assert (g.index, g.name, g.util_pct, g.mem_used_mib, g.mem_total_mib) == (0, "NVIDIA H200", 100, 1139, 143771)
    assert g.mem_fraction == pytest.approx(1139 / 143771)


def test_idle_and_header_with_units():
    (idle,) = gpumon.parse_query((FIX / "query_idle.csv").read_text(), FULL)
    assert idle.util_pct == 0 and idle.mem_used_mib == 0
    # --format=csv (header, units in values): header skipped, units stripped
    (hdr,) = gpumon.parse_query((FIX / "query_busy_header.csv").read_text(), FULL)
    assert hdr.util_pct == 99 and hdr.mem_total_mib == 143771


def test_stream_groups_ticks():
    lines = iter((FIX / "query_stream.csv").read_text().splitlines())
    ticks = list(gpumon.group_stream(lines, FULL))
    assert len(ticks) == 6 and all(len(t) == 1 for t in ticks)
    assert [t[0].util_pct for t in ticks] == [100, 100, 100, 100, 99, 100]


def test_stream_multi_gpu_and_garbage():
    rows = ["0, NVIDIA H200, 10, 100, 143771", "1, NVIDIA H200, 20, 200, 143771",
            "Failed to initialize NVML: Driver/library version mismatch",
            "0, NVIDIA H200, 30, 300, 143771", "1, NVIDIA H200, [N/A], 400, 143771"]
    ticks = list(gpumon.group_stream(iter(rows)))
    assert [[g.util_pct for g in t] for t in ticks] == [[10, 20], [30, None]]


def test_query_argv_is_one_long_lived_query():
    argv = gpumon.query_argv()
    assert argv[0] == "nvidia-smi" and argv[-2:] == ["-lms", "1000"]
    assert "--query-gpu=index,name,utilization.gpu,memory.used,memory.total" in argv


def test_cpu_sample_from_proc():
    stat1 = "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 50 0 50 400 0 0 0 0 0 0\ncpu1 50 0 50 400 0 0 0 0 0 0\n"
    stat2 = "cpu  200 0 200 900 0 0 0 0 0 0\ncpu0 100 0 100 450 0 0 0 0 0 0\ncpu1 100 0 100 450 0 0 0 0 0 0\n"
    s, prev = gpumon.cpu_sample(1, stat1, "0.50 0.40 0.30 1/100 42", None)
    assert s.cpu_util_pct is None and s.load1 == 0.5 and s.cpu_count == 2
    s, _ = gpumon.cpu_sample(1, stat2, "1.50 0.40 0.30 1/100 42", prev)
    assert s.cpu_util_pct == pytest.approx(200 / 300 * 100) and s.cpu_only


def test_monitor_local_cpu_node_samples_and_stops():
    import threading

    from qwen_tui.nodes.transport.local import LocalTransport

    got, ev = [], threading.Event()

    def on(s):
        got.append(s)
        ev.set()

    mon = gpumon.GpuMonitor({0: LocalTransport()}, on, gpu_nodes={0: False})
    mon.start()
    assert ev.wait(5), "no CPU sample within 5 s"
    mon.stop()
    assert got[0].rank == 0 and got[0].cpu_only and 0 <= got[0].cpu_util_pct <= 100
    assert not any(th.is_alive() for th in mon._threads)


class _ReplayNvidiaSmi:
    """A transport whose one stream answers `nvidia-smi --query-gpu=F... -lms N` from the
    recorded H200 stream (tests/fixtures/nvidia-smi/query_stream.csv, columns FULL):
    each line is projected onto the fields the argv asks for and handed over one at a
    time, as the real stream would."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.emitted_before: list[int] = []  # samples the monitor had emitted before each line
        self.samples: list = []

    def stream_lines(self, argv, *, stop, timeout_first_line, **kw):
        self.calls.append(list(argv))
        fields = next(a for a in argv if a.startswith("--query-gpu=")).split("=", 1)[1].split(",")
        for ln in (FIX / "query_stream.csv").read_text().splitlines():
            row = dict(zip(FULL, [p.strip() for p in ln.split(", ")]))
            self.emitted_before.append(len(self.samples))
            yield ", ".join(row[f] for f in fields)
            if stop.is_set():
                return
        stop.wait(30)  # the real stream does not end by itself: hold until stopped


def test_stream_fed_line_by_line_through_the_monitor():
    import threading

    t = _ReplayNvidiaSmi()
    done = threading.Event()

    def on(s):
        t.samples.append(s)
        if len(t.samples) == 6:
            done.set()

    mon = gpumon.GpuMonitor({1: t}, on, gpu_nodes={1: True})
    mon.start()
    try:
        assert done.wait(10), t.samples
    finally:
        mon.stop()
    assert not any(th.is_alive() for th in mon._threads)
    # ONE long-lived query, at most one row a second
    assert t.calls == [gpumon.query_argv()] and t.calls[0][-2:] == ["-lms", "1000"]
    assert [s.rank for s in t.samples] == [1] * 6 and all(s.error is None for s in t.samples)
    assert [s.gpus[0].util_pct for s in t.samples] == [100, 100, 100, 100, 99, 100]
    g = t.samples[0].gpus[0]
    assert (g.index, g.name, g.mem_used_mib, g.mem_total_mib) == (0, "NVIDIA H200", 1139, 143771)
    # each tick is emitted as its row arrives (one GPU: only the first tick waits for
    # the second row, which tells that the node has one GPU)
    assert t.emitted_before == [0, 0, 2, 3, 4, 5]


def test_monitor_falls_back_to_cpu_when_the_stream_says_nothing():
    import threading

    class NoSmi:
        def __init__(self):
            self.calls = []

        def stream_lines(self, argv, *, stop, timeout_first_line, **kw):
            self.calls.append(argv[0])
            if argv[0] == "nvidia-smi":
                yield "sh: 1: exec: nvidia-smi: not found"
                return
            k = 0
            while not stop.is_set():
                k += 1
                yield f"cpu  {100 * k} 0 {100 * k} {800 * k} 0 0 0 0 0 0\t2\t0.50"
                stop.wait(0.05)

    t, ev, got = NoSmi(), threading.Event(), []
    mon = gpumon.GpuMonitor({0: t}, lambda s: (got.append(s), ev.set()), pythons={0: "/opt/py/bin/python"})
    mon.start()
    try:
        assert ev.wait(5)
    finally:
        mon.stop()
    assert t.calls == ["nvidia-smi", "/opt/py/bin/python"]
    assert got[0].cpu_only and got[0].cpu_count == 2 and got[0].load1 == 0.5
    assert got[0].cpu_util_pct == pytest.approx(20)


def _live_children() -> set[int]:
    """This process's live (non-zombie) children; other tests' daemons (a cluster's sshd) may be among them."""
    import os
    out = set()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(") ", 1)[-1].split()
        except OSError:
            continue  # exited while we looked
        if fields[1] == str(os.getpid()) and fields[0] != "Z":
            out.add(int(p))
    return out


def test_local_stream_lines_ends_its_process_group():
    import threading
    import time

    from qwen_tui.nodes.transport.local import LocalTransport
    from qwen_tui.nodes.transport.protocol import TransportError

    before = _live_children()
    stop = threading.Event()
    it = LocalTransport().stream_lines(["sh", "-c", "while :; do echo x; sleep 0.1; done"], stop=stop,
                                       timeout_first_line=5)
    assert [next(it) for _ in range(2)] == ["x", "x"]
    assert _live_children() - before, "the stream runs as a child while it is read"
    it.close()
    with pytest.raises(TransportError, match="no output within"):
        list(LocalTransport().stream_lines(["sleep", "30"], stop=stop, timeout_first_line=0.5))
    assert list(LocalTransport().stream_lines(["no-such-program-qt"], stop=stop, timeout_first_line=1)) == []
    t0 = time.monotonic()
    threading.Timer(0.5, stop.set).start()
    assert list(LocalTransport().stream_lines(["sleep", "30"], stop=stop, timeout_first_line=30)) == []
    assert time.monotonic() - t0 < 3
    # no child of ours left behind (sh loop, sleeps)
    assert _live_children() - before == set()
