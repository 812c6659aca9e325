"""The `qwen-tui` command: main (the parser and the run, attach, runs, export, show commands) and one module per
further sub-command (check, estimate, data, after)."""
