"""Checks the Run screen's GPU parser (qwen_tui.run.watch.gpumon) on real nvidia-smi output.

    $(python -c "from qwen_tui.run.watch import gpumon; print(' '.join(gpumon.query_argv(loop_ms=500)))") \\
        > stream.csv &                                              # while something trains (gpumon's own query)
    python bench/gpumon_check.py stream.csv                         # prints a JSON verdict

Every line must parse into a sample whose fields agree with an independent split of the same
line; the ticks must group one sample per GPU; the total memory must match what
`nvidia-smi --query-gpu=memory.total` says now (when nvidia-smi is there).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qwen_tui.run.watch import gpumon


def _number(row: dict, key: str) -> float | None:
    return float(row[key]) if row.get(key) not in (None, "[N/A]", "N/A") else None


def check(text: str) -> dict:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    problems = []
    samples = []
    for ln in lines:
        s = gpumon.parse_gpu_line(ln)
        raw = [x.strip() for x in ln.split(",")]
        if s is None:
            problems.append(f"unparsed: {ln!r}")
            continue
        samples.append(s)
        row = dict(zip(gpumon.FIELDS, raw))
        want = (int(row["index"]), row["name"], *(_number(row, k) for k in ("utilization.gpu", "memory.used",
                                                                             "memory.total")))
        got = (s.index, s.name, s.util_pct, s.mem_used_mib, s.mem_total_mib)
        if want != got:
            problems.append(f"{ln!r}: parsed {got}, expected {want}")
    ticks = list(gpumon.group_stream(iter(lines)))
    n_gpus = len({s.index for s in samples})
    if any(len(t) != n_gpus for t in ticks):
        problems.append(f"ticks of uneven size: {[len(t) for t in ticks][:20]}")
    out = {"lines": len(lines), "samples": len(samples), "ticks": len(ticks), "gpus": n_gpus}
    if samples:
        out.update(util_max=max(s.util_pct or 0 for s in samples), mem_used_max_mib=max(s.mem_used_mib or 0 for s in samples),
                   mem_total_mib=samples[0].mem_total_mib, name=samples[0].name,
                   mem_fraction_max=max(s.mem_fraction or 0 for s in samples))
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
        if q.returncode == 0 and samples:
            totals = [float(x) for x in q.stdout.split()]
            out["nvidia_smi_memory_total_now"] = totals
            if samples[0].mem_total_mib != totals[0]:
                problems.append(f"memory.total parsed {samples[0].mem_total_mib}, nvidia-smi says {totals[0]}")
    except FileNotFoundError:
        out["nvidia_smi_memory_total_now"] = "nvidia-smi not found"
    if not samples:
        problems.append("no samples")
    out["problems"] = problems
    out["ok"] = not problems
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python bench/gpumon_check.py STREAM.csv", file=sys.stderr)
        return 2
    res = check(Path(argv[0]).read_text(encoding="utf-8", errors="replace"))
    print(json.dumps(res, indent=1))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
