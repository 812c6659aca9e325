"""Every node's GPU load, as the monitor sees it, handed to the worker's trackers (--report_to) beside the loss.

The worker on node 0 cannot see the other nodes' GPUs; qwen-tui's monitor (run.gpumon) sees all of them. While
qwen-tui follows a run it appends what it saw to gpus.jsonl beside the run's metrics.jsonl on the master node, one
line per node every few seconds (the mean of that node's samples since the last line), and rank 0 logs those lines
to its trackers at its next logging step (training.trackers.NodeGpuFeed reads this format):

    {"time": 1796146508.7, "node": 1, "label": "gpu-b", "samples": 5,
     "gpus": [{"index": 0, "util": 97.4, "mem_used_mib": 60211.0, "mem_total_mib": 143771.0}, ...]}
    {"time": ..., "node": 2, "label": "cpu-c", "samples": 5, "cpu_util": 88.0}     (a CPU-only node)

A node that only reported errors in a window gets no line. Appends go through node 0's transport as one quoted
`cat >> PATH` with the lines on stdin, bounded by a timeout; a failed append drops that window (kept in
`last_error`), so a master that is unreachable for a while costs memory for nothing.
"""

from __future__ import annotations

import json
import posixpath
import threading
import time
from collections.abc import Callable

from ...nodes.programs import program
from .gpumon import GpuMonitor, NodeSample

SERIES_NAME = "gpus.jsonl"
APPEND_PRIVATE = program("append_private.sh")  # stdin appended to $1, made 0600 if new
FLUSH_S = 5.0
FIRST_LOOK_S = 0.25


def series_path(metrics_file: str) -> str:
    """Where the series go: beside metrics.jsonl on the master node (the worker's --node_gpu_file default)."""
    return posixpath.join(posixpath.dirname(metrics_file), SERIES_NAME)


def reports_to_tracker(argv: list[str]) -> bool:
    """Whether a worker command line (a node's argv) logs to a tracker: --report_to with anything but none."""
    for i, word in enumerate(argv):
        if word == "--report_to":
            value = argv[i + 1] if i + 1 < len(argv) else ""
        elif word.startswith("--report_to="):
            value = word.split("=", 1)[1]
        else:
            continue
        return value.strip().lower() not in ("", "none")
    return False


class _Window:
    """One node's samples since the last flush."""

    def __init__(self, label: str):
        self.label = label
        self.samples = 0
        self.gpus: dict[int, dict[str, list[float]]] = {}
        self.cpu: list[float] = []

    def add(self, s: NodeSample) -> None:
        if s.error:
            return
        got = False
        for g in s.gpus:
            slot = self.gpus.setdefault(g.index, {"util": [], "mem_used_mib": [], "mem_total_mib": []})
            for key, v in (("util", g.util_pct), ("mem_used_mib", g.mem_used_mib), ("mem_total_mib", g.mem_total_mib)):
                if v is not None:
                    slot[key].append(v)
                    got = True
        if s.cpu_util_pct is not None:
            self.cpu.append(s.cpu_util_pct)
            got = True
        self.samples += got

    def line(self, rank: int, now: float) -> dict | None:
        if not self.samples:
            return None
        rec: dict = {"time": now, "node": rank, "label": self.label, "samples": self.samples}
        if self.gpus:
            rec["gpus"] = [{"index": i, **{k: (sum(v) / len(v) if v else None) for k, v in slot.items()}}
                           for i, slot in sorted(self.gpus.items())]
        if self.cpu:
            rec["cpu_util"] = sum(self.cpu) / len(self.cpu)
        return rec


class GpuSeriesWriter:
    """Collects NodeSamples (add() is called from the monitor's sampler threads) and appends one line per node to
    `path` on the master through `transport`, every `interval` seconds from its own thread, and once more at stop()."""

    def __init__(self, transport, path: str, labels: dict[int, str] | None = None, *,
                 interval: float = FLUSH_S, timeout: float = 15.0, clock: Callable[[], float] = time.time):
        self.transport = transport
        self.path = path
        self.labels = labels or {}
        self.interval = interval
        self.timeout = timeout
        self.clock = clock
        self.lines_written = 0
        self.last_error: str | None = None
        self._windows: dict[int, _Window] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, s: NodeSample) -> None:
        with self._lock:
            w = self._windows.get(s.rank)
            if w is None:
                w = self._windows[s.rank] = _Window(self.labels.get(s.rank, str(s.rank)))
            w.add(s)

    def flush(self) -> int:
        """Appends what was collected since the last flush; returns the lines written (0 on nothing or failure)."""
        with self._lock:
            windows, self._windows = self._windows, {}
        now = self.clock()
        lines = [rec for r, w in sorted(windows.items()) if (rec := w.line(r, now)) is not None]
        if not lines:
            return 0
        data = "".join(json.dumps(rec) + "\n" for rec in lines).encode()
        try:
            # a new file is 0600, as every file of the run directory
            res = self.transport.run(["sh", "-c", APPEND_PRIVATE, "sh", self.path], timeout=self.timeout, input=data)
        except Exception as e:  # the master may be unreachable for a moment: this window is dropped
            self.last_error = f"{type(e).__name__}: {e}"
            return 0
        if not res.ok:
            self.last_error = (res.stderr or res.stdout or f"exit {res.rc}").strip()[-200:]
            return 0
        self.lines_written += len(lines)
        return len(lines)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="gpu-series", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        # Until every node has been written once, a node's first samples go out as soon as they come (a look every
        # FIRST_LOOK_S): the worker's first logging steps then have every node's load. With one short first window
        # instead, a node whose sampler started a moment later missed it, and a run of a few seconds logged that
        # node's load never (seen once in CI: cpu/node1 absent from TensorBoard).
        written: set[int] = set()
        expected = set(self.labels)
        waited = 0.0
        while not self._stop.wait(FIRST_LOOK_S):
            waited += FIRST_LOOK_S
            with self._lock:
                new = {r for r, w in self._windows.items() if w.samples} - written
            if new or waited >= self.interval:
                with self._lock:
                    written |= {r for r, w in self._windows.items() if w.samples}
                self.flush()
                waited = 0.0
            if expected and written >= expected:
                break
        while not self._stop.wait(self.interval):
            self.flush()

    def stop(self, timeout: float = 20.0, flush_last: bool = True) -> None:
        """Ends the flush thread (bounded) and writes what is left (not when the worker has ended anyway)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        if flush_last:
            self.flush()


class NodeWatch:
    """The monitor of a launched run's nodes, and (when its worker reports to a tracker) the writer that hands
    the samples to the worker. on_sample: the face's own callback (the TUI's panels), or None."""

    def __init__(self, la, on_sample: Callable[[NodeSample], None] | None = None,
                 gpu_nodes: dict[int, bool] | None = None, series: bool | None = None):
        plan = la.plan
        master_argv = plan.nodes[0].argv if plan.nodes else []
        series = reports_to_tracker(master_argv) if series is None else series
        self.writer = (GpuSeriesWriter(la.transports[0], series_path(plan.metrics_file),
                                       {c.rank: c.label for c in plan.nodes}) if series else None)
        face = on_sample

        def sample(s: NodeSample) -> None:
            if self.writer is not None:
                self.writer.add(s)
            if face is not None:
                face(s)

        self.monitor = GpuMonitor(la.transports, sample, gpu_nodes=gpu_nodes,
                                  pythons={c.rank: c.argv[0] for c in plan.nodes if c.argv})

    def start(self) -> None:
        self.monitor.start()
        if self.writer is not None:
            self.writer.start()

    def stop(self, flush_last: bool = True) -> None:
        self.monitor.stop()
        if self.writer is not None:
            self.writer.stop(flush_last=flush_last)
