"""torch.compile of each decoder layer ("regional" compilation).

Every decoder layer runs the same code, so with inlined nn.Modules (PyTorch's default) one
compiled graph serves all of them: compile time is one layer's, not the model's. Inductor
fuses the RMSNorms, the SwiGLU, RoPE and the LoRA adds around the matmuls. The embedding,
final norm and loss stay eager (the loss has its own fused kernel, training.fast.loss).

The layers are compiled with dynamic shapes from the start. Packed rows change width from one
micro-batch to the next (rounded up to a multiple of 1,024 tokens on CUDA), and so does the
number of records in a row (the length of cu_seq_lens). With static shapes the first compile
is specialised to the first row's sizes, and the first row of another width compiles every
layer again (torch's automatic dynamic shapes), seconds of a training step at an arbitrary
point of the run (an 8-second step among sub-second ones on an H200). Dynamic from the first
compile, one graph serves every width and every record count. Parameters stay static.
One more compile comes from Inductor guarding its 32-bit indexing and fusion choices on a range of the
row width (on the H200: `4096 <= width`): the first row on the other side of that bound compiles
once more (8 s). The worker therefore compiles the layers before its memory probes, whose rows
of 2,048 and 4,096 tokens meet both sides at start-up, so that no training step compiles.
Dropout (LoRA's, on every adapted projection's input) runs as ATen's own kernel inside the compiled
graph (Inductor's fallback_random): the masks are then the ones the eager model draws from the same
seed, so compiled and plain runs see identical dropout, and ATen's kernel draws four random numbers
per Philox call where Inductor's generated code draws one (TRAINING_COMPILE_RANDOM=inductor restores
Inductor's own fused random numbers, for comparison).
Duck shaping is turned off for the process: with it, a row exactly as wide as some other size of the
first compile (the hidden size, 2,048 on a 3B model, say) shares that size's symbol and is
specialised to it, so the next width compiles again.
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


def compile_decoder_layers(model, backend: str | None = None, mode: str | None = None, dynamic: bool = True,
                           forward_only: bool = False) -> int:
    """Compiles every decoder layer in place; returns how many. Nothing runs until the first forward.
    dynamic=True: the row width and the record count are symbolic in the first compile (see above).
    backend: Inductor unless TRAINING_COMPILE_BACKEND names another (the CPU tests trace the worker's compiled layers
    with aot_eager: Dynamo and AOTAutograd as on a GPU, without building C++ kernels).
    forward_only: compile the layer's forward and leave its module hooks eager. DeepSpeed ZeRO-3 gathers a
    layer's partitioned weights in hooks around the forward (training.fast.zero3): compiling the whole call
    would trace the hooks, which cannot be traced."""
    import os

    import torch._inductor.config as inductor_config

    layers = decoder_of(model).layers
    backend = backend or os.environ.get("TRAINING_COMPILE_BACKEND", "inductor")
    inductor_config.fallback_random = os.environ.get("TRAINING_COMPILE_RANDOM", "aten") != "inductor"
    if dynamic:
        import torch.fx.experimental._config as fx_config

        fx_config.use_duck_shape = False  # a row width equal to the hidden size stays symbolic
    for layer in layers:
        if forward_only:
            layer.forward = torch.compile(layer.forward, backend=backend, mode=mode, dynamic=dynamic)
        else:
            layer.compile(backend=backend, mode=mode, dynamic=dynamic)
    return len(layers)


def compile_available(device: torch.device) -> bool:
    """Inductor needs Triton on CUDA; on CPU it needs a C++ compiler and is slow to start, so the worker
    compiles on CUDA only unless the user asks."""
    if device.type != "cuda":
        return False
    import importlib.util

    return importlib.util.find_spec("triton") is not None
