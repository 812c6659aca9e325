# Appends stdin to a file made private (0600) if new (qwen_tui.run.gpuseries, the GPU series on the master):
# sh -c SCRIPT sh FILE.
umask 077; cat >> "$1"
