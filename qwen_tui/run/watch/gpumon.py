"""Live GPU (or CPU) load of every node, for the Run screen. Core: no Textual.

One sampler thread per node, at most one sample a second, each from ONE
long-lived query per node whenever the transport can stream
(`stream_lines(argv, stop=..., timeout_first_line=...)`: LocalTransport runs a
subprocess, SSHTransport one exec channel under a pty, so that closing the
channel ends the remote command):
- a GPU node is watched by one
  `nvidia-smi --query-gpu=... --format=csv,noheader,nounits -lms 1000`;
- a CPU-only node (no GPUs in its facts, or nvidia-smi missing) by one small
  Python loop on the node (`CPU_LOOP`, started with argv) that prints the first
  line of /proc/stat, the CPU count and the 1-minute load once a second. This
  machine's own CPU is read from /proc directly.
A transport without `stream_lines` falls back to a bounded poll: one query a
second, each with a timeout. A stream that fails (the node drops) is shown as
an error sample and started again after a pause.

Samples go to a callback (the UI posts them as coalescing Messages).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ...nodes.programs import program

FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total")
INTERVAL_MS = 1000


def query_argv(fields: Sequence[str] = FIELDS, loop_ms: int | None = INTERVAL_MS) -> list[str]:
    argv = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    if loop_ms:
        argv += ["-lms", str(loop_ms)]
    return argv


@dataclass
class GpuSample:
    index: int
    name: str
    util_pct: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None

    @property
    def mem_fraction(self) -> float | None:
        if self.mem_used_mib is None or not self.mem_total_mib:
            return None
        return self.mem_used_mib / self.mem_total_mib


@dataclass
class NodeSample:
    rank: int
    gpus: list[GpuSample] = field(default_factory=list)
    cpu_util_pct: float | None = None  # CPU-only nodes: busy share of all cores since the last sample
    load1: float | None = None
    cpu_count: int | None = None
    error: str | None = None

    @property
    def cpu_only(self) -> bool:
        return not self.gpus and (self.cpu_util_pct is not None or self.load1 is not None)


def _num(v: str) -> float | None:
    # values may carry units ("143771 MiB", "99 %") when a query omits nounits;
    # "[N/A]" / "[Not Supported]" mean unknown
    v = v.strip()
    for unit in (" MiB", " %", " W"):
        v = v.removesuffix(unit)
    try:
        return float(v)
    except ValueError:
        return None


def parse_gpu_line(line: str, fields: Sequence[str] = FIELDS) -> GpuSample | None:
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


class TickGrouper:
    """Groups the rows of a `-lms` stream into ticks, one line at a time. The
    stream prints one row per GPU per tick. The first tick ends when the GPU
    index stops growing; after that the GPU count is known and a tick is complete
    as soon as its last row arrives (no one-tick lag)."""

    def __init__(self, fields: Sequence[str] = FIELDS):
        self.fields = fields
        self.rows = 0  # GPU rows seen so far
        self._cur: list[GpuSample] = []
        self._n: int | None = None

    def push(self, line: str) -> list[list[GpuSample]]:
        """Feed one line; the ticks it completed (none, one, rarely two)."""
        s = parse_gpu_line(line, self.fields)
        if s is None:
            return []
        self.rows += 1
        out = []
        if self._cur and s.index <= self._cur[-1].index:
            self._n = self._n or len(self._cur)
            out.append(self._cur)
            self._cur = []
        self._cur.append(s)
        if self._n is not None and len(self._cur) == self._n:
            out.append(self._cur)
            self._cur = []
        return out

    def flush(self) -> list[list[GpuSample]]:
        out, self._cur = ([self._cur] if self._cur else []), []
        return out


def group_stream(lines: Iterator[str], fields: Sequence[str] = FIELDS) -> Iterator[list[GpuSample]]:
    """Ticks of a whole `-lms` stream (see TickGrouper)."""
    g = TickGrouper(fields)
    for ln in lines:
        yield from g.push(ln)
    yield from g.flush()


# ------------------------------------------------------------------ CPU

def parse_proc_stat(text: str) -> tuple[int, int] | None:
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
               prev: tuple[int, int] | None) -> tuple[NodeSample, tuple[int, int] | None]:
    cur = parse_proc_stat(stat_text)
    util = None
    if cur and prev and cur[1] > prev[1]:
        util = 100.0 * (cur[0] - prev[0]) / (cur[1] - prev[1])
    try:
        load1 = float(loadavg_text.split()[0])
    except (IndexError, ValueError):
        load1 = None
    return NodeSample(rank=rank, cpu_util_pct=util, load1=load1, cpu_count=cpu_count_from_stat(stat_text) or None), cur


# One process on the node, one line a second: "<cpu line of /proc/stat>\t<cpus>\t<load1>".
# The interval is argv[1]; the loop ends when its output goes away (SIGHUP from the closed pty, or EPIPE).
CPU_LOOP = program("cpu_sampler.py")
CPU_LOOP_MARK = "qwen-tui cpu sampler"  # a comment in its first line: what finds it in the node's process list


def cpu_loop_argv(python: str = "python3", interval: float = INTERVAL_MS / 1000) -> list[str]:
    return [python, "-u", "-c", CPU_LOOP, f"{max(1.0, interval):g}"]


def parse_cpu_stream_line(rank: int, line: str, prev: tuple[int, int] | None
                          ) -> tuple[NodeSample | None, tuple[int, int] | None]:
    """One CPU_LOOP line -> (sample, counters); (None, prev) when the line is not one."""
    parts = line.rstrip("\r\n").split("\t")
    if len(parts) != 3 or not parts[0].startswith("cpu "):
        return None, prev
    try:
        ncpu, load1 = int(parts[1]), float(parts[2])
    except ValueError:
        return None, prev
    s, cur = cpu_sample(rank, parts[0], f"{load1} 0 0", prev)
    s.cpu_count = ncpu or None
    return s, cur


# ------------------------------------------------------------------ samplers

class GpuMonitor:
    """Start one sampler per node; `on_sample(NodeSample)` is called from sampler threads.

    `pythons` names the interpreter per node for the CPU loop (default python3)."""

    RETRY_S = 5.0  # a failed stream is started again after this pause

    def __init__(self, transports: dict, on_sample: Callable[[NodeSample], None], *,
                 gpu_nodes: dict[int, bool] | None = None, interval: float = INTERVAL_MS / 1000,
                 timeout: float = 10.0, pythons: dict[int, str] | None = None):
        self.transports = transports
        self.on_sample = on_sample
        self.gpu_nodes = gpu_nodes or {}
        self.pythons = pythons or {}
        self.interval = max(1.0, interval)  # at most once a second, whatever the caller asks
        self.timeout = timeout
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for rank, t in sorted(self.transports.items()):
            th = threading.Thread(target=self._node, args=(rank, t), name=f"gpumon-{rank}", daemon=True)
            th.start()
            self._threads.append(th)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every sampler; streams notice within a fraction of a second and end
        their command (bounded: `timeout` for all threads together)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for th in self._threads:
            th.join(timeout=max(0.0, deadline - time.monotonic()))

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

    def _stream(self, rank: int, t, argv: list[str], handle: Callable[[str], bool]) -> bool:
        """Feed the lines of one long-lived `argv` to `handle` (True when a line was a
        sample) until stopped; restart it after a failure. False when the first run
        ended without a single sample (the program is missing or has nothing to say)."""
        ever = False
        while not self._stop.is_set():
            got = False
            try:
                for ln in t.stream_lines(argv, stop=self._stop, timeout_first_line=self.timeout,
                                         idle_timeout=self.timeout + 5 * self.interval):
                    got = handle(ln) or got
                    if self._stop.is_set():
                        break
            except Exception as e:  # the node may drop for a moment: show it, try again
                self._emit(NodeSample(rank=rank, error=f"{type(e).__name__}: {e}"))
            else:
                if not got and not ever and not self._stop.is_set():
                    return False
            ever = ever or got
            self._stop.wait(self.RETRY_S)
        return True

    def _gpus(self, rank: int, t) -> bool:
        """Watch GPUs until stopped. False when the node has no usable nvidia-smi (use the CPU sampler)."""
        return self._gpus_stream(rank, t)

    def _gpus_stream(self, rank: int, t) -> bool:
        argv = query_argv(loop_ms=int(self.interval * 1000))
        return self._stream(rank, t, argv, self._gpu_feeder(rank))

    def _gpu_feeder(self, rank: int) -> Callable[[str], bool]:
        """A line handler: rows grouped into ticks as they arrive, each tick emitted."""
        g = TickGrouper()

        def feed(line: str) -> bool:
            before = g.rows
            for tick in g.push(line):
                self._emit(NodeSample(rank=rank, gpus=tick))
            return g.rows > before
        return feed

    def _cpu(self, rank: int, t) -> None:
        from ...nodes.transport.local import LocalTransport

        if not isinstance(t, LocalTransport):
            self._cpu_stream(rank, t)
            return
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

    def _cpu_stream(self, rank: int, t) -> None:
        prev: list[tuple[int, int] | None] = [None]

        def feed(line: str) -> bool:
            s, prev[0] = parse_cpu_stream_line(rank, line, prev[0])
            if s is None:
                return False
            if s.cpu_util_pct is not None:
                self._emit(s)
            return True

        argv = cpu_loop_argv(self.pythons.get(rank, "python3"), self.interval)
        if not self._stream(rank, t, argv, feed):
            self._emit(NodeSample(rank=rank, error=f"the CPU sampler printed nothing ({argv[0]} on the node?)"))
