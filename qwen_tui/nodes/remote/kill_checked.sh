# Signals processes given as "pid:start" pairs whose start time (/proc/PID/stat field 22) is still the same, so
# a reused pid is never signalled (qwen_tui.nodes.ssh): sh -c SCRIPT sh SIGNAL PID:START... Prints how many
# were signalled.
sig=$1; shift; n=0;
for ps in "$@"; do
  p=${ps%%:*}; st=${ps#*:};
  s=$(cat "/proc/$p/stat" 2>/dev/null) || continue;
  s=${s##*)}; set -f; set -- $s; set +f;
  [ "${20}" = "$st" ] && kill -s "$sig" -- "$p" 2>/dev/null && n=$((n+1));
done; echo "$n"
