"""--profile_step N: one optimizer step under torch.profiler, its top kernels written beside the metrics
(and with --profile_trace its Chrome trace, whose phases the loop labels with marker()).

Where the time of a step goes (matmuls, attention, the fused elementwise kernels, the optimizer) is
the first thing to look at when a run is slower than its estimate; this answers it from inside the
real run, on the real shapes, without another tool.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
from pathlib import Path

import torch


def start(device: torch.device):
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=acts)
    prof.start()
    return prof


def marker(prof):
    """mark(name) -> a context that labels a phase of the step in the profile (the trace shows which phase
    launched each kernel); a no-op when the step is not profiled."""
    if prof is None:
        return lambda name: contextlib.nullcontext()
    return torch.profiler.record_function


def stop(prof, device: torch.device) -> None:
    """Stops the profiler once the step's kernels have run (its events are read afterwards)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    prof.stop()


def finish(prof, device: torch.device, path: Path, wall_s: float, rows: int = 30, trace: Path | None = None) -> str:
    """Stops the profiler and writes the step's wall time, how much of it the GPU was busy (the rest is the
    GPU waiting for the host: Python, data, synchronisation) and the table of the `rows` most expensive
    kernels (device time on CUDA, CPU time otherwise) to `path`, atomically; returns the text. With `trace`,
    the step's Chrome trace goes there too (gzip-compressed when the name ends in .gz)."""
    stop(prof, device)
    if trace is not None:
        _write_trace(prof, Path(trace))
    events = prof.key_averages()
    head = f"step wall time {wall_s:.3f} s"
    if device.type == "cuda":
        from torch.autograd import DeviceType

        busy = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e6
        head += f"; GPU kernels {busy:.3f} s ({busy / wall_s:.1%} of it)" if wall_s > 0 else ""
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = head + "\n" + events.table(sort_by=key, row_limit=rows, max_name_column_width=90)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(table + "\n")
    os.replace(tmp, path)
    return table


def _write_trace(prof, path: Path) -> None:
    """The profiler's Chrome trace at `path`, written under a temporary name and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = path.with_name(path.name + ".raw.tmp")
    prof.export_chrome_trace(str(raw))
    tmp = path.with_name(path.name + ".tmp")
    if path.name.endswith(".gz"):
        with open(raw, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
    else:
        os.replace(raw, tmp)
    os.replace(tmp, path)
