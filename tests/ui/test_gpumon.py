"""The GPU monitor's parsers on real nvidia-smi output (H200 fixtures) and the CPU sampler."""

from pathlib import Path

import pytest

from qwen_tui.run import gpumon

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
    from qwen_tui.nodes.transport import LocalTransport

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
