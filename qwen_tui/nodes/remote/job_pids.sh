# The job's live processes (qwen_tui.nodes.ssh): sh -c SCRIPT sh PGID. Its process group, plus every process
# whose environment carries the job mark QWEN_TUI_JOB_PGID=PGID (qwen_tui.nodes.jobs.JOB_MARK; torchrun's
# ranks run in sessions of their own). Zombies do not count. Prints one pid a line.
pg=$1;
{ for f in $(grep -lzx -- "QWEN_TUI_JOB_PGID=$pg" /proc/[0-9]*/environ 2>/dev/null); do
    d=${f%/environ}; echo "${d#/proc/}"; done;
  ps -A -o pid=,pgid= | while read -r p g; do [ "$g" = "$pg" ] && echo "$p"; done; } | sort -u |
while read -r p; do
  s=$(cut -d")" -f2 "/proc/$p/stat" 2>/dev/null | cut -c2);
  [ -n "$s" ] && [ "$s" != Z ] && echo "$p";
done; true
