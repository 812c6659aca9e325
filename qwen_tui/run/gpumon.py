"""Live GPU (or CPU) load of every node, for the Run screen. Core: no Textual.

One sampler thread per node, at most one sample a second:
- a GPU node is watched by ONE long-lived
  `nvidia-smi --query-gpu=... --format=csv,noheader,nounits -lms 1000` when the
  transport can stream (this machine: a subprocess; any transport that offers
  `stream_lines(argv, ...)`). The Transport protocol has no streaming call, so over
  SSH the sampler falls back to a bounded poll: one query a second, each with a
  timeout, on the transport's reused connection;
- a CPU-only node (no GPUs in its facts, or nvidia-smi missing) is sampled from
  /proc/loadavg and the deltas of /proc/stat's first line.

Samples go to a callback (the UI posts them as coalescing Messages).
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total")
INTERVAL_MS = 1000


def query_argv(fields: Sequence[str] = FIELDS, loop_ms: Optional[int] = INTERVAL_MS) -> list[str]:
    argv = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    if loop_ms:
        argv += ["-lms", str(loop_ms)]
    return argv


@dataclass
class GpuSample:
    index: int
    name: str
    util_pct: Optional[float]
    mem_used_mib: Optional[float]
    mem_total_mib: Optional[float]

    @property
    def mem_fraction(self) -> Optional[float]:
        if self.mem_used_mib is None or not self.mem_total_mib:
            return None
        return self.mem_used_mib / self.mem_total_mib


@dataclass
class NodeSample:
    rank: int
    gpus: list[GpuSample] = field(default_factory=list)
    cpu_util_pct: Optional[float] = None  # CPU-only nodes: busy share of all cores since the last sample
    load1: Optional[float] = None
    cpu_count: Optional[int] = None
    error: Optional[str] = None

    @property
    def cpu_only(self) -> bool:
        return not self.gpus and (self.cpu_util_pct is not None or self.load1 is not None)


def _num(v: str) -> Optional[float]:
    # values may carry units ("143771 MiB", "99 %") when a query omits nounits;
    # "[N/A]" / "[Not Supported]" mean unknown
    v = v.strip()
    for unit in (" MiB", " %", " W"):
        v = v.removesuffix(unit)
    try:
        return float(v)
    except ValueError:
        return None


def parse_gpu_line(line: str, fields: Sequence[str] = FIELDS) -> Optional[GpuSample]:
    """One CSV row of a --query-gpu output (fields in `fields` order) -> a sample; None if not a row."""
    parts = [p.strip() for p in line.strip().split(", ")]
    if len(parts) != len(fields):
        return None
    row = dict(zip(fields, parts))
    idx = _num(row.get("index", ""))
    if idx is None:
        return None  # a header row or an error message
    return GpuSample(index=int(idx), name=row.get("name", ""), util_pct=_num(row.get("utilization.gpu", "")),
                     mem_used_mib=_num(row.get("memory.used", "")),
                     mem_total_mib=_num(row.get("memory.total", "")))


def parse_query(text: str, fields: Sequence[str] = FIELDS) -> list[GpuSample]:
    return [s for s in (parse_gpu_line(ln, fields) for ln in text.splitlines()) if s is not None]


def group_stream(lines: Iterator[str], fields: Sequence[str] = FIELDS) -> Iterator[list[GpuSample]]:
    """A `-lms` stream prints one row per GPU per tick. The first tick ends when the
    GPU index stops growing; after that the GPU count is known and a tick is
    yielded as soon as its last row arrives (no one-tick lag)."""
    cur: list[GpuSample] = []
    n: Optional[int] = None
    for ln in lines:
        s = parse_gpu_line(ln, fields)
        if s is None:
            continue
        if cur and s.index <= cur[-1].index:
            n = n or len(cur)
            yield cur
            cur = []
        cur.append(s)
        if n is not None and len(cur) == n:
            yield cur
            cur = []
    if cur:
        yield cur


# ------------------------------------------------------------------ CPU

def parse_proc_stat(text: str) -> Optional[tuple[int, int]]:
    """(busy, total) jiffies from the `cpu ` line of /proc/stat."""
    for ln in text.splitlines():
        if ln.startswith("cpu "):
            vals = [int(x) for x in ln.split()[1:]]
            idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
            total = sum(vals[:8])  # guest time is already inside user/nice
            return total - idle, total
    return None


def cpu_count_from_stat(text: str) -> int:
    return sum(1 for ln in text.splitlines() if ln.startswith("cpu") and ln[3:4].isdigit())


def cpu_sample(rank: int, stat_text: str, loadavg_text: str,
               prev: Optional[tuple[int, int]]) -> tuple[NodeSample, Optional[tuple[int, int]]]:
    cur = parse_proc_stat(stat_text)
    util = None
    if cur and prev and cur[1] > prev[1]:
        util = 100.0 * (cur[0] - prev[0]) / (cur[1] - prev[1])
    try:
        load1 = float(loadavg_text.split()[0])
    except (IndexError, ValueError):
        load1 = None
    return NodeSample(rank=rank, cpu_util_pct=util, load1=load1, cpu_count=cpu_count_from_stat(stat_text) or None), cur


# ------------------------------------------------------------------ samplers

class GpuMonitor:
    """Start one sampler per node; `on_sample(NodeSample)` is called from sampler threads."""

    def __init__(self, transports: dict, on_sample: Callable[[NodeSample], None], *,
                 gpu_nodes: Optional[dict[int, bool]] = None, interval: float = INTERVAL_MS / 1000,
                 timeout: float = 10.0):
        self.transports = transports
        self.on_sample = on_sample
        self.gpu_nodes = gpu_nodes or {}
        self.interval = max(1.0, interval)  # at most once a second, whatever the caller asks
        self.timeout = timeout
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        for rank, t in sorted(self.transports.items()):
            th = threading.Thread(target=self._node, args=(rank, t), name=f"gpumon-{rank}", daemon=True)
            th.start()
            self._threads.append(th)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for p in self._procs:
                if p.poll() is None:
                    p.terminate()
        for th in self._threads:
            th.join(timeout=3)
        with self._lock:
            for p in self._procs:
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=3)

    # -- per node
    def _node(self, rank: int, t) -> None:
        gpu = self.gpu_nodes.get(rank)
        if gpu is None or gpu:
            if self._gpus(rank, t):
                return
        self._cpu(rank, t)

    def _emit(self, s: NodeSample) -> None:
        if not self._stop.is_set():
            self.on_sample(s)

    def _gpus(self, rank: int, t) -> bool:
        """Watch GPUs until stopped. False when the node has no usable nvidia-smi (use the CPU sampler)."""
        from ..nodes.transport import LocalTransport

        if isinstance(t, LocalTransport) or hasattr(t, "stream_lines"):
            return self._gpus_stream(rank, t)
        return self._gpus_poll(rank, t)

    def _gpus_stream(self, rank: int, t) -> bool:
        argv = query_argv(loop_ms=int(self.interval * 1000))
        if hasattr(t, "stream_lines"):
            lines = t.stream_lines(argv, stop=self._stop)
        else:
            try:
                p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     text=True, bufsize=1)
            except FileNotFoundError:
                return False
            with self._lock:
                self._procs.append(p)
            lines = iter(p.stdout.readline, "")
        got = False
        for tick in group_stream(lines):
            got = True
            self._emit(NodeSample(rank=rank, gpus=tick))
            if self._stop.is_set():
                break
        if not got and not self._stop.is_set():
            return False  # printed nothing we could read: no GPU here
        return True

    def _gpus_poll(self, rank: int, t) -> bool:
        argv = query_argv(loop_ms=None)
        first = True
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                r = t.run(argv, timeout=self.timeout)
            except Exception as e:  # the node may drop for a moment: show it, keep trying
                self._emit(NodeSample(rank=rank, error=f"{type(e).__name__}: {e}"))
            else:
                gpus = parse_query(r.stdout) if r.ok else []
                if first and not gpus:
                    return False
                if gpus:
                    self._emit(NodeSample(rank=rank, gpus=gpus))
                else:
                    self._emit(NodeSample(rank=rank, error=(r.stderr or r.stdout).strip()[-200:]))
            first = False
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))
        return True

    def _cpu(self, rank: int, t) -> None:
        from ..nodes.transport import LocalTransport

        prev = None
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                if isinstance(t, LocalTransport):
                    with open("/proc/stat") as f:
                        stat = f.read()
                    with open("/proc/loadavg") as f:
                        load = f.read()
                else:
                    r = t.run(["cat", "/proc/stat", "/proc/loadavg"], timeout=self.timeout)
                    if not r.ok:
                        raise RuntimeError((r.stderr or "cat /proc/stat failed").strip()[-200:])
                    # /proc/loadavg is the last line
                    stat, _, load = r.stdout.rstrip("\n").rpartition("\n")
                s, prev = cpu_sample(rank, stat, load, prev)
                if s.cpu_util_pct is not None:
                    self._emit(s)
            except Exception as e:  # shown in the node's panel; the sampler keeps going
                self._emit(NodeSample(rank=rank, error=f"{type(e).__name__}: {e}"))
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))
