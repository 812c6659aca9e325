# Is a key in the node's ~/.ssh/authorized_keys (qwen_tui.nodes.keys): sh -c SCRIPT sh KEY. Exit 0: yes.
f="$HOME/.ssh/authorized_keys"; [ -f "$f" ] && grep -qF -- "$1" "$f"
