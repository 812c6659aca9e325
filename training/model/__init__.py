"""The model: loading it, turning it into what the method trains, saving it.

pretrained    model and tokenizer loading, LoRA / Q-LoRA, gradient checkpointing, saving and merging
moe           mixture-of-experts Qwen: expert layouts, router loss, ZeRO-3 leaves
result        what a finished run left in its output directory, loaded for inference (merge and chat)
tiny          the tiny built-in models (`builtin:tiny`, ...), built offline
"""
