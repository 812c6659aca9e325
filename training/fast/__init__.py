"""The worker's fast path on a GPU, each piece a switch the user can turn off.

choice.py     which switches are on for this run, each with its reason (decide)
apply.py      the switches applied to the built model: loss module, attention kernel, compiled layers, row sizes
packing.py    padding-free batches: records packed into one row, position_ids restart per record
attention.py  the attention that keeps packed records apart (flash varlen on CUDA, per-record SDPA elsewhere)
loss.py       cross-entropy that never builds the full logits (Liger's fused kernel, or chunked in torch)
compile.py    torch.compile of each decoder layer (one graph reused by every layer)
optim.py      fused AdamW where the device has it
autobatch.py  the largest packed micro-batch that fits, and gradient checkpointing only when nothing fits without it
step.py       one micro-batch's forward and summed loss, for either path
preference.py DPO: pairs packed into rows, their answers' log-probabilities, the sigmoid and IPO losses
lora_dropout.py  LoRA's dropout inside the Triton kernel of the adapter's first matmul (drawn again in backward)
allocator.py  expandable CUDA memory segments (set before torch starts CUDA) and the allocator's retry count
sequence_parallel.py  one packed row spread over the ranks of a group (Ulysses), for records longer than one GPU holds
long_context.py       the MLP computed in tiles of the sequence (--tiled_mlp), for long records on one GPU

Nothing here imports qwen_tui.
"""
