"""What a run does not use, kept from costing it anything: libraries never imported, an op never built.

peft imports bitsandbytes when it is installed, and so does transformers' scheduler module (through peft): about
1 s of CPU in every rank of every run, plus its CUDA library probe on GPU nodes, though only Q-LoRA's 4-bit base
uses it. Refused before anything imports it, it is simply absent to both libraries: `importlib.util.find_spec`
answers None for a name held as None in `sys.modules`, which is how they ask whether it is installed. DeepSpeed imports mlflow with itself (its
autotuner, which a run never starts), about 1 s of CPU in every DeepSpeed rank; and on CPU its communication
backend compiles a shared-memory all-reduce for inference on a node's first run. Every ZeRO engine imports
DeepSpeed's Muon optimizer to ask whether the run's optimizer is one, and that module wraps its kernels in
torch.compile as it loads, which imports Inductor: about 0.9 s of CPU in every DeepSpeed rank of a run that
never compiles."""

from __future__ import annotations

import os
import sys


def refuse_bitsandbytes_unless(q_lora: bool) -> bool:
    """Without --q_lora, marks bitsandbytes as not importable in this process; True if it did."""
    if q_lora or "bitsandbytes" in sys.modules:
        return False
    sys.modules["bitsandbytes"] = None  # type: ignore[assignment]  # None: "import fails", by Python's import system
    return True


def refuse_mlflow_unless(report_to: list[str]) -> bool:
    """Unless --report_to names mlflow (or all), marks mlflow as not importable in this process; True if it did."""
    names = {n.strip().lower() for v in report_to for n in v.split(",")}
    if names & {"mlflow", "all"} or "mlflow" in sys.modules:
        return False
    sys.modules["mlflow"] = None  # type: ignore[assignment]
    return True


def skip_deepspeed_cpu_shm_op(device_type: str) -> bool:
    """On CPU, before deepspeed.init_distributed: DeepSpeed's CPU backend serves inference_all_reduce, which training
    never calls, from a shared-memory op it builds with g++ on a node's first run (about a minute of CPU, while
    the other ranks wait on its lock), then checks and loads in every rank, after probing every op's compiler
    support (compiler subprocesses, about 0.8 s a rank). Marked incompatible, none of that runs. GPU backends
    have no such op. True if it marked it."""
    if device_type == "cuda":
        return False
    import deepspeed.ops

    # DeepSpeed probes this dict on first read and reads it only to decide whether to build that op; set before
    # the first read, it is never probed.
    deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}
    return True


MUON = "deepspeed.runtime.zero.muon.muon_optimizer"


def load_deepspeed_muon_uncompiled(client_optimizer) -> bool:
    """Before deepspeed.initialize, when the worker hands DeepSpeed its own optimizer (AdamW, never Muon): imports
    DeepSpeed's Muon module with TorchDynamo off, so its kernels stay plain functions and Inductor is not loaded
    for them. The engine then only checks the optimizer's type against it. A DeepSpeed config that names its own
    optimizer (client_optimizer None) may name Muon: left alone. True if it loaded it so; False also where this
    DeepSpeed has no Muon module (older releases): nothing to avoid."""
    if client_optimizer is None or MUON in sys.modules:
        return False
    before = os.environ.get("TORCHDYNAMO_DISABLE")
    os.environ["TORCHDYNAMO_DISABLE"] = "1"  # torch.compile reads it on every call: a no-op wrapper while set
    try:
        __import__(MUON)
    except ImportError:
        return False
    finally:
        if before is None:
            del os.environ["TORCHDYNAMO_DISABLE"]
        else:
            os.environ["TORCHDYNAMO_DISABLE"] = before
    return True
