"""Library messages that say nothing about this run, kept out of every node's log, each one matched by its own
words at its source (never a whole logger or warning category):

- bitsandbytes, on a CPU with AVX-512 bf16, warns at import that the optional `kernels` package is missing
  (its fallback kernel is used, as on every other CPU);
- transformers warns that `is_gradient_checkpointing` is deprecated whenever peft reads it to wrap a model;
- torch warns that `all_gather_into_tensor` and `reduce_scatter_tensor` are deprecated each time DeepSpeed's
  ZeRO calls them, dozens of lines a step;
- DeepSpeed, on a machine without a GPU, says it is "Setting accelerator to CPU": dropped only for a CPU run,
  where that is the plan (`cpu_run(True)`), not where a GPU went missing;
- torchao, where its CUDA extensions (CUTLASS, MX kernels) do not load (a machine without a GPU, another torch),
  says so at import: its float8 training runs torch's own _scaled_mm and needs none of them;
- torch warns that torchao registers its Enums (KernelPreference, ...) as pytree constants, which it no longer
  needs.
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
        # the message as it will be written (torch's carries the class in its arguments)
        return not record.getMessage().startswith(self.start)


def install() -> None:
    """Before the libraries are imported (a filter on a logger that does not exist yet waits for it)."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
        _Drop("Failed to load CPU gemm_4bit_forward from kernels-community"))
    logging.getLogger("DeepSpeed").addFilter(_Drop("Setting accelerator to CPU", only_cpu=True))
    logging.getLogger("torchao").addFilter(_Drop("Failed to load "))
    logging.getLogger("torch.utils._pytree").addFilter(_Drop("<enum '"))
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning,
                            module=r"transformers\.modeling_utils")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed\.c10d_logger",
                            message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")


def cpu_run(on: bool) -> None:
    _state["cpu_run"] = on
