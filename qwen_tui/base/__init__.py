"""The ground floor: shell quoting, redaction of secrets, atomic writes, logging set-up and refusals in plain words.
Imports nothing else of qwen_tui."""
