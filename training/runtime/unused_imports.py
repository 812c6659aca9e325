"""Libraries a run does not use, kept from being imported at all.

peft imports bitsandbytes when it is installed, and so does transformers' scheduler module (through peft): about
1 s of CPU in every rank of every run, plus its CUDA library probe on GPU nodes, though only Q-LoRA's 4-bit base
uses it. Refused before anything imports it, it is simply absent to both libraries: `importlib.util.find_spec`
answers None for a name held as None in `sys.modules`, which is how they ask whether it is installed."""

from __future__ import annotations

import sys


def refuse_bitsandbytes_unless(q_lora: bool) -> bool:
    """Without --q_lora, marks bitsandbytes as not importable in this process; True if it did."""
    if q_lora or "bitsandbytes" in sys.modules:
        return False
    sys.modules["bitsandbytes"] = None  # type: ignore[assignment]  # None: "import fails", by Python's import system
    return True
