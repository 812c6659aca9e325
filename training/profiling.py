"""--profile_step N: one optimizer step under torch.profiler, its top kernels written beside the metrics.

Where the time of a step goes (matmuls, attention, the fused elementwise kernels, the optimizer) is
the first thing to look at when a run is slower than its estimate; this answers it from inside the
real run, on the real shapes, without another tool.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


def start(device: torch.device):
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=acts)
    prof.start()
    return prof


def finish(prof, device: torch.device, path: Path, wall_s: float, rows: int = 30) -> str:
    """Stops the profiler and writes the step's wall time, how much of it the GPU was busy (the rest is the
    GPU waiting for the host: Python, data, synchronisation) and the table of the `rows` most expensive
    kernels (device time on CUDA, CPU time otherwise) to `path`, atomically; returns the text."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    prof.stop()
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
