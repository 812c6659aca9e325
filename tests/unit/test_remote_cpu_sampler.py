"""The CPU sampler (qwen_tui/nodes/remote/cpu_sampler.py), run as the monitor starts it on a node
(gpumon.cpu_loop_argv) with the plain system python3: its lines parse into samples, it carries its mark in
its command line, and it ends when its reader goes away."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time

from qwen_tui.run.watch.gpumon import CPU_LOOP_MARK, cpu_loop_argv, parse_cpu_stream_line

NODE_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def test_lines_parse_into_samples_and_the_loop_ends_with_its_reader():
    p = subprocess.Popen(cpu_loop_argv(NODE_PY, 1.0), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(p.stdout.readline()) or lines.put(p.stdout.readline()),
                     daemon=True).start()
    try:
        first, second = lines.get(timeout=10), lines.get(timeout=10)
        # read once it has written: right after Popen the child may not have exec'd yet (an empty cmdline)
        assert CPU_LOOP_MARK.encode() in open(f"/proc/{p.pid}/cmdline", "rb").read()
        stat, ncpu, load1 = first.rstrip("\n").split("\t")
        cpus = sum(1 for ln in open("/proc/stat") if ln.startswith("cpu") and ln[3:4].isdigit())
        assert stat.startswith("cpu ") and int(ncpu) == cpus and float(load1) >= 0
        s1, prev = parse_cpu_stream_line(3, first, None)
        s2, _ = parse_cpu_stream_line(3, second, prev)
        assert s1.rank == 3 and s1.cpu_count == cpus and s1.cpu_util_pct is None  # one line: no interval yet
        assert 0.0 <= s2.cpu_util_pct <= 100.0 and s2.load1 == float(second.split("\t")[2])
        p.stdout.close()  # the pty closing, as the monitor's stream ends: the next write fails
        t0 = time.monotonic()
        assert p.wait(timeout=5) != 0 and time.monotonic() - t0 < 5
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=5)
