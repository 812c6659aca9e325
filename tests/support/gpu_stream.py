"""Real nvidia-smi output as the monitor's GPU sampler reads it: the H200's `--query-gpu ... -lms` rows from
tests/fixtures/nvidia-smi, one tick each. Shared by the GPU series tests and the worker's tracker tests."""

from __future__ import annotations

from qwen_tui.run.watch.gpumon import group_stream
from support.paths import FIXTURES

# the columns of the fixtures' --query-gpu (tests/fixtures/nvidia-smi/README.md)
FIELDS = ("index", "name", "uuid", "pci.bus_id", "driver_version", "memory.total", "memory.used", "memory.free",
          "utilization.gpu", "utilization.memory", "temperature.gpu", "power.draw", "power.limit")


def stream_ticks():
    """The H200's six `-lms` rows (GPU 0, busy), one tick each."""
    return list(group_stream(iter((FIXTURES / "nvidia-smi" / "query_stream.csv").read_text().splitlines()), FIELDS))
