# The evidence about a slow node (qwen_tui.run.evidence): sh -c SCRIPT. Prints the load average and the core
# count, then one CSV line per GPU: utilization %, SM clock, max SM clock (MHz), temperature (C); no GPU lines
# where there is no nvidia-smi.
cat /proc/loadavg 2>/dev/null;
getconf _NPROCESSORS_ONLN 2>/dev/null;
command -v nvidia-smi >/dev/null &&
  nvidia-smi --query-gpu=utilization.gpu,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader,nounits 2>/dev/null;
exit 0
