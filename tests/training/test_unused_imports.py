"""A run without --q_lora never imports bitsandbytes (peft and transformers' scheduler module would, at ~1 s of
CPU a rank), and both libraries then see it as not installed.
With --q_lora it is imported as usual: the Q-LoRA runs of tests/training/test_train.py load their 4-bit base
through it."""

import subprocess
import sys

from support.paths import ROOT

_PROBE = """
import sys
from training.runtime.unused_imports import refuse_bitsandbytes_unless
refused = refuse_bitsandbytes_unless({q_lora})
import peft, transformers.optimization
from peft.import_utils import is_bnb_available
from transformers.utils import is_bitsandbytes_available
print(refused, sys.modules.get("bitsandbytes") is not None, is_bnb_available(), is_bitsandbytes_available())
"""


def _probe(q_lora: bool) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(q_lora=q_lora)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()


def test_without_q_lora_bitsandbytes_is_never_imported_and_reads_as_absent():
    assert _probe(False) == ["True", "False", "False", "False"]

