# The node's own public key, made by the node's ssh-keygen if it has none (qwen_tui.nodes.keys):
# sh -c SCRIPT sh COMMENT. Prints the public key line; exit 93: ssh-keygen failed.
k="$HOME/.ssh/id_ed25519";
if [ ! -f "$k" ]; then umask 077; mkdir -p "$HOME/.ssh" && ssh-keygen -q -t ed25519 -N "" -C "$1" -f "$k" || exit 93; fi;
cat "$k.pub"
