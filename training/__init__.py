"""The fine-tuning worker that torchrun starts on every node. Never imports qwen_tui."""
