"""The data preview run on the master: the worker's counts (`python -m training.datapreview`, the command
advice.datapreview.preview_command builds) through node 0's transport, met with the estimate's timing and the
advice about the data (advice.datapreview, pure). `qwen-tui data`, the launch API and the wizard's Training step
call it."""

from __future__ import annotations

from typing import Any

from ...advice.datapreview import build_report, preview_command, tokens_per_second, trainable_limit
from ...cluster.facts import ClusterFacts
from ...nodes.transport.protocol import Transport
from ...preset.schema import Preset
from .json_tool import run_json_tool

DEFAULT_TIMEOUT_S = 900.0  # tokenizing a large data set on the master takes a while; still bounded


class DataPreviewError(RuntimeError):
    """The preview could not run or the worker's code refused the data (the message names what)."""


def count_data(preset: Preset, transport: Transport, *, base_dir: str = ".", local_python: str | None = None,
               timeout: float = DEFAULT_TIMEOUT_S, bins: int = 16, longer_than: int | None = None) -> dict[str, Any]:
    """The worker-side counts (training.datapreview's JSON), run on the master through `transport`."""
    argv, cwd = preview_command(preset, base_dir=base_dir, local_python=local_python, bins=bins,
                                longer_than=longer_than)
    return run_json_tool(transport, argv, cwd=cwd, timeout=timeout, what="data preview", error=DataPreviewError)


def preview(preset: Preset, transport: Transport, facts: ClusterFacts | None = None, *, base_dir: str = ".",
            gpu: str | None = None, bandwidth_gbps: float | None = None, efficiency: float | None = None,
            tokens_per_second_override: float | None = None, timeout: float = DEFAULT_TIMEOUT_S,
            local_python: str | None = None, bins: int = 16, nic_gbps: float | None = None) -> dict[str, Any]:
    """Counts on the master, timing from the estimate (or the given tokens/s): the whole report."""
    limit, limit_where = trainable_limit(preset, facts, gpu=gpu, base_dir=base_dir)
    counts = count_data(preset, transport, base_dir=base_dir, timeout=timeout, local_python=local_python, bins=bins,
                        longer_than=limit)
    if tokens_per_second_override:
        tps, source = tokens_per_second_override, "as given"
    else:
        tps, source = tokens_per_second(preset, facts, gpu=gpu, bandwidth_gbps=bandwidth_gbps, efficiency=efficiency,
                                        base_dir=base_dir, nic_gbps=nic_gbps)
    return build_report(counts, preset, tps, source, limit, limit_where)
