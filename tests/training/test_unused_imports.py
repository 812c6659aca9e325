"""A run without --q_lora never imports bitsandbytes (peft and transformers' scheduler module would, at ~1 s of
CPU a rank), and both libraries then see it as not installed.
With --q_lora it is imported as usual: the Q-LoRA runs of tests/training/test_train.py load their 4-bit base
through it. A run that does not report to MLflow never imports mlflow (deepspeed would, ~1 s a rank), and on CPU
DeepSpeed's shared-memory op for inference is never built or loaded."""

import os
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



_DEEPSPEED_PROBE = """
import sys
from training.runtime.unused_imports import refuse_mlflow_unless, skip_deepspeed_cpu_shm_op
refused = refuse_mlflow_unless({report_to!r})
import deepspeed
from deepspeed.comm.torch import build_shm_op
print(refused, sys.modules.get("mlflow") is not None, skip_deepspeed_cpu_shm_op("cpu"), build_shm_op() is None)
"""


def _deepspeed_probe(report_to: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _DEEPSPEED_PROBE.format(report_to=report_to)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()[-4:]


def test_deepspeed_imports_no_mlflow_and_builds_no_cpu_op_unless_mlflow_is_reported_to():
    # Without the skip, build_shm_op compiles the op (a minute of g++) and returns it.
    assert _deepspeed_probe(["none"]) == ["True", "False", "True", "True"]
    assert _deepspeed_probe(["tensorboard,mlflow"]) == ["False", "True", "True", "True"]
    assert _deepspeed_probe(["all"])[:2] == ["False", "True"]


def test_the_shm_op_is_left_alone_on_gpu_nodes():
    from training.runtime.unused_imports import skip_deepspeed_cpu_shm_op

    assert skip_deepspeed_cpu_shm_op("cuda") is False


_MUON_PROBE = """
import os, sys
import torch, deepspeed
from training.runtime.unused_imports import MUON, load_deepspeed_muon_uncompiled
os.environ.pop("TORCHDYNAMO_DISABLE", None)
if {helped}:
    print(load_deepspeed_muon_uncompiled(None), MUON in sys.modules)  # a config's own optimizer: left alone
    print(load_deepspeed_muon_uncompiled(object()), load_deepspeed_muon_uncompiled(object()))
else:
    __import__(MUON)
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
print("torch._inductor.compile_fx" in sys.modules, "TORCHDYNAMO_DISABLE" in os.environ)
# torch.compile compiles as before once it is loaded: one graph traced
from torch._dynamo.utils import counters
torch.compile(lambda x: x * 2, backend="eager")(torch.ones(2))
print(counters["stats"]["unique_graphs"])
"""


def _muon_probe(helped: bool) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _MUON_PROBE.format(helped=helped)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-4:]


def test_deepspeeds_muon_module_loads_without_inductor_and_compile_stays_on():
    """Every ZeRO engine imports DeepSpeed's Muon module; imported plainly it wraps its kernels in torch.compile,
    which loads Inductor (about 0.9 s a rank). Loaded by the worker before the engine, Inductor stays out, the
    switch it uses is put back, and torch.compile still compiles afterwards."""
    assert _muon_probe(True) == ["False False", "True False", "False False", "1"]
    assert _muon_probe(False)[-2:] == ["True False", "1"]  # what it avoids


def test_a_deepspeed_without_muon_is_no_error(monkeypatch):
    """deepspeed>=0.16 is allowed, and Muon came later: where the module is missing there is nothing to avoid, and
    the switch is put back all the same."""
    from training.runtime import unused_imports

    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    monkeypatch.setattr(unused_imports, "MUON", "no_such_deepspeed_muon_module")
    assert unused_imports.load_deepspeed_muon_uncompiled(object()) is False
    assert "TORCHDYNAMO_DISABLE" not in os.environ
