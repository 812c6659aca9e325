# The shared-storage check's marker (qwen_tui.nodes.storage): sh -c SCRIPT sh DIR TOKEN NAME writes TOKEN into
# NAME in DIR or, when DIR does not exist yet, in its nearest existing parent (the filesystem DIR will be made
# on): a check creates no directory. Never writes through an existing file (noclobber). Prints the directory used.
d=$1;
while [ ! -d "$d" ]; do p=$(dirname -- "$d"); [ "$p" = "$d" ] && exit 1; d=$p; done;
(set -C; printf %s "$2" > "$d/$3") && printf %s "$d"
