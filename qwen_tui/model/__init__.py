"""The model's shape: parameters, layers and heads of a Qwen model by name or config (spec), and what sequence
parallelism asks of those heads (seqparallel). Pure; the preset checks a shape as it loads."""
