"""torch.compile of each decoder layer ("regional" compilation).

Every decoder layer runs the same code, so with inlined nn.Modules (PyTorch's default) one
compiled graph serves all of them: compile time is one layer's, not the model's. Inductor
fuses the RMSNorms, the SwiGLU, RoPE and the LoRA adds around the matmuls. The embedding,
final norm and loss stay eager (the loss has its own fused kernel, training.fast.loss).
"""

from __future__ import annotations

import torch


def decoder_of(model):
    """The decoder stack (Qwen2Model) of a causal LM, through a peft wrapper if there is one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


def lm_head_of(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_output_embeddings()


def compile_decoder_layers(model, backend: str = "inductor", mode: str | None = None) -> int:
    """Compiles every decoder layer in place; returns how many. Nothing runs until the first forward."""
    layers = decoder_of(model).layers
    for layer in layers:
        layer.compile(backend=backend, mode=mode)
    return len(layers)


def compile_available(device: torch.device) -> bool:
    """Inductor needs Triton on CUDA; on CPU it needs a C++ compiler and is slow to start, so the worker
    compiles on CUDA only unless the user asks."""
    if device.type != "cuda":
        return False
    import importlib.util

    return importlib.util.find_spec("triton") is not None
