# The candidate processes of a job (qwen_tui.nodes.ssh): sh -c SCRIPT sh PGID RUN_ID. One line per candidate:
# "pid<TAB>stat text<TAB>marks" (marks: qwen_tui.nodes.jobs.READ_MARKS's NAME=value pairs from its environment,
# space-separated).
# Candidates: the leader $1, its group's members, and every process whose environment carries
# QWEN_TUI_RUN_ID=$2 (qwen_tui.nodes.jobs.RUN_MARK). qwen_tui.nodes.jobs decides which of them are the job's.
pg=$1; run=$2;
{ echo "$pg";
  grep -lzxF -- "QWEN_TUI_RUN_ID=$run" /proc/[0-9]*/environ 2>/dev/null | sed "s#^/proc/##; s#/environ\$##";
  ps -A -o pid=,pgid= | while read -r p g; do [ "$g" = "$pg" ] && echo "$p"; done; } | sort -u |
while read -r p; do
  s=$(cat "/proc/$p/stat" 2>/dev/null) || continue;
  m=$(tr "\0" "\n" <"/proc/$p/environ" 2>/dev/null | grep -E "^(QWEN_TUI_JOB_PGID|QWEN_TUI_RUN_ID|QWEN_TUI_STOPPING)=" | tr "\n" " ");
  printf "%s\t%s\t%s\n" "$p" "$s" "$m";
done; true
