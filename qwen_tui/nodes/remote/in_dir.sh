# Runs argv in a directory without a shell seeing the directory's name (qwen_tui.nodes.ssh, every command with
# a cwd): sh -c SCRIPT sh DIR ARGV... Exit 96: no such directory.
cd -- "$1" || exit 96;
shift;
exec "$@"
