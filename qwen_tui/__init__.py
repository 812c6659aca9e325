"""qwen-tui: set up, check, launch and watch multi-node Qwen fine-tuning."""

__version__ = "0.1.0"
