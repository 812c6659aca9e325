"""Library messages that say nothing about this run, kept out of every node's log, each one matched by its own
words at its source (never a whole logger or warning category):

- bitsandbytes, on a CPU with AVX-512 bf16, warns at import that the optional `kernels` package is missing
  (its fallback kernel is used, as on every other CPU);
- transformers warns that `is_gradient_checkpointing` is deprecated whenever peft reads it to wrap a model;
- torch warns that `all_gather_into_tensor` and `reduce_scatter_tensor` are deprecated each time DeepSpeed's
  ZeRO calls them, dozens of lines a step;
- DeepSpeed, on a machine without a GPU, says it is "Setting accelerator to CPU": dropped only for a CPU run,
  where that is the plan (`cpu_run(True)`), not where a GPU went missing.
"""

from __future__ import annotations

import logging
import warnings

_state = {"cpu_run": False}


class _Drop(logging.Filter):
    def __init__(self, start: str, only_cpu: bool = False):
        super().__init__()
        self.start, self.only_cpu = start, only_cpu

    def filter(self, record: logging.LogRecord) -> bool:
        if self.only_cpu and not _state["cpu_run"]:
            return True
        return not str(record.msg).startswith(self.start)


def install() -> None:
    """Before the libraries are imported (a filter on a logger that does not exist yet waits for it)."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
        _Drop("Failed to load CPU gemm_4bit_forward from kernels-community"))
    logging.getLogger("DeepSpeed").addFilter(_Drop("Setting accelerator to CPU", only_cpu=True))
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning,
                            module=r"transformers\.modeling_utils")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed\.c10d_logger",
                            message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")


def cpu_run(on: bool) -> None:
    _state["cpu_run"] = on
