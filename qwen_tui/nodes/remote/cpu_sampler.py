# The CPU sampler (qwen_tui.run.gpumon): python3 -u -c PROGRAM INTERVAL_S. One line a second:
# "<cpu line of /proc/stat>\t<cpus>\t<load1>". The loop keeps its own schedule (no drift) and ends when its
# output goes away (SIGHUP from the closed pty, or EPIPE). The comment on its first line is the mark that
# finds it in a node's process list (CPU_LOOP_MARK).

import sys, time  # qwen-tui cpu sampler
iv = max(1.0, float(sys.argv[1])); nxt = time.monotonic()
while True:
    with open("/proc/stat") as f:
        lines = f.read().splitlines()
    with open("/proc/loadavg") as f:
        load1 = f.read().split()[0]
    ncpu = sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())
    sys.stdout.write(lines[0] + "\t" + str(ncpu) + "\t" + load1 + "\n"); sys.stdout.flush()
    nxt += iv
    time.sleep(max(0.0, nxt - time.monotonic()))
