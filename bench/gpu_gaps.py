"""Where the GPU waited in a profiled step: the idle gaps of a torch.profiler Chrome trace, and what the host
was doing then; with --kernels, also where its busy time went.

    python -m training.finetune ... --profile_step 13 --profile_trace
    python bench/gpu_gaps.py OUTPUT_DIR/profile-step13.json.gz [--min-gap-us 20] [--top 25] [--kernels] [--json OUT]

Every kernel, copy and fill on the device is merged into busy intervals; what lies between them (and between
the step's first host event and its first kernel, and its last kernel and last host event) is idle. Each gap
is charged to the kernel that ended it: the phase of the step that launched it (the worker labels its phases
"step: forward", "step: backward", ...), the operator that launched it, and the runtime calls the launching
thread was in during the gap (a synchronisation, an allocation, a copy from pageable memory).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import sys
from collections import defaultdict

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
# What a kernel is, from its name: the first rule that matches (lower-case substrings). Matmuls are cuBLAS's
# (nvjet, *gemm*, cutlass, xmma); Triton's kernels are Inductor's fusions or Liger's unless named otherwise.
KERNEL_KINDS = [
    ("attention", ("flash", "fmha", "cudnn", "sdpa", "attn")),
    ("loss", ("liger", "cross_entropy")),
    ("optimizer", ("multi_tensor_apply", "adam")),
    ("collective", ("nccl",)),
    ("matmul", ("nvjet", "gemm", "cutlass", "xmma", "cublas", "splitk")),
    ("dropout (ATen)", ("fused_dropout",)),
    ("fused elementwise (Triton)", ("triton_",)),
    ("copy / fill", ("memcpy", "memset", "copy", "fill")),
    ("ATen elementwise", ("elementwise_kernel", "vectorized", "reduce_kernel", "index")),
]
HOST_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function"}


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


class _Thread:
    """One host thread's events, sorted by start, for "what encloses time t" queries."""

    def __init__(self, events: list[dict]):
        self.events = sorted(events, key=lambda e: e["ts"])
        self.starts = [e["ts"] for e in self.events]

    def enclosing(self, t: float, cats: set[str], look_back: int = 4000) -> list[dict]:
        """Events of these categories that contain time t, outermost first (looks back a bounded number)."""
        i = bisect.bisect_right(self.starts, t)
        out = [e for e in self.events[max(0, i - look_back):i] if e.get("cat") in cats and e["ts"] + e.get("dur", 0) >= t]
        return sorted(out, key=lambda e: -e.get("dur", 0))

    def overlapping(self, a: float, b: float, cats: set[str], look_back: int = 4000) -> dict[str, float]:
        """Summed overlap with [a, b] by event name, for events of these categories."""
        i = bisect.bisect_right(self.starts, b)
        out: dict[str, float] = defaultdict(float)
        for e in self.events[max(0, i - look_back):i]:
            if e.get("cat") not in cats:
                continue
            lo, hi = max(a, e["ts"]), min(b, e["ts"] + e.get("dur", 0))
            if hi > lo:
                out[e["name"]] += hi - lo
        return dict(out)


def analyse(events: list[dict], min_gap_us: float = 20.0) -> dict:
    gpu = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in HOST_CATS]
    if not gpu or not host:
        raise SystemExit("the trace has no device kernels or no host events (was it profiled on CUDA?)")
    launches = {e["args"]["correlation"]: e for e in host
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    threads: dict = defaultdict(list)
    for e in host:
        threads[(e["pid"], e["tid"])].append(e)
    threads = {k: _Thread(v) for k, v in threads.items()}
    annotations = [e for e in host if e.get("cat") == "user_annotation" and e["name"].startswith("step:")]
    t_first = min(e["ts"] for e in host)
    t_last = max(e["ts"] + e.get("dur", 0) for e in host)

    # Busy intervals of the device, and the gaps between them.
    gaps = []
    busy = 0.0
    end, prev = None, None
    for e in gpu:
        s, f = e["ts"], e["ts"] + e.get("dur", 0)
        if end is None:
            gaps.append((t_first, s, None, e))
            cur_s, end = s, f
        elif s > end:
            busy += end - cur_s
            gaps.append((end, s, prev, e))
            cur_s, end = s, f
        else:
            end = max(end, f)
        prev = e if prev is None or f >= prev["ts"] + prev.get("dur", 0) else prev
    busy += end - cur_s
    gaps.append((end, t_last, prev, None))

    rows = []
    for a, b, before, after in gaps:
        if b - a < min_gap_us:
            continue
        row = {"start_us": a - t_first, "gap_us": b - a, "before": before["name"] if before else "(step start)",
               "after": after["name"] if after else "(step end)", "phase": "", "op": "", "host": {}}
        launch = launches.get(after["args"].get("correlation")) if after is not None else None
        thread = threads.get((launch["pid"], launch["tid"])) if launch is not None else None
        if launch is not None:
            t = launch["ts"]
            phase = [x["name"] for x in annotations if x["ts"] <= t <= x["ts"] + x.get("dur", 0)]
            row["phase"] = phase[-1] if phase else "(unlabelled)"
            ops = thread.enclosing(t, {"cpu_op"})
            row["op"] = " > ".join(x["name"] for x in ops[-2:]) if ops else launch["name"]
        elif after is None:
            row["phase"] = "(after the last kernel)"
        # What the host threads were in while the device idled: runtime calls and the operators around them.
        host_busy: dict[str, float] = defaultdict(float)
        for th in ([thread] if thread is not None else threads.values()):
            for k, v in th.overlapping(a, b, {"cuda_runtime", "cuda_driver"}).items():
                host_busy[k] += v
        row["host"] = dict(sorted(host_busy.items(), key=lambda kv: -kv[1])[:4])
        rows.append(row)

    by_cause: dict[tuple, list] = defaultdict(lambda: [0, 0.0])
    for r in rows:
        c = by_cause[(r["phase"], r["op"].split(" > ")[-1] if r["op"] else r["after"][:40])]
        c[0] += 1
        c[1] += r["gap_us"]
    runtime_totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in host:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            t = runtime_totals[e["name"]]
            t[0] += 1
            t[1] += e.get("dur", 0)
    wall = t_last - t_first
    return {
        "wall_us": wall, "device_busy_us": busy, "device_busy_share": busy / wall if wall else None,
        "idle_us": wall - busy, "gaps_counted": len(rows), "gaps_counted_us": sum(r["gap_us"] for r in rows),
        "min_gap_us": min_gap_us,
        "by_cause": sorted(({"phase": k[0], "op": k[1], "gaps": v[0], "us": v[1]} for k, v in by_cause.items()),
                           key=lambda x: -x["us"]),
        "largest": sorted(rows, key=lambda r: -r["gap_us"]),
        "runtime_calls": sorted(({"name": k, "calls": v[0], "us": v[1]} for k, v in runtime_totals.items()),
                                key=lambda x: -x["us"]),
    }


def kernel_kind(name: str, cat: str = "kernel") -> str:
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "copy / fill"
    low = name.lower()
    for kind, keys in KERNEL_KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def kernel_mix(events: list[dict]) -> dict:
    """The device time of the step by kind of kernel (KERNEL_KINDS) and by the phase that launched it, with each
    kind's most expensive kernels. Times are kernel durations summed (kernels on parallel streams both count)."""
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    if not gpu:
        raise SystemExit("the trace has no device kernels (was it profiled on CUDA?)")
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launches = {e["args"]["correlation"]: e["ts"] for e in host if "correlation" in e.get("args", {})}
    spans = sorted(((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events if e.get("ph") == "X"
                    and e.get("cat") == "user_annotation" and e["name"].startswith("step:")))

    def phase_at(t):
        inside = [name for a, b, name in spans if a <= t <= b]
        return inside[-1] if inside else "(unlabelled)"

    kinds: dict[str, dict] = defaultdict(lambda: {"us": 0.0, "count": 0, "by_phase": defaultdict(float),
                                                  "kernels": defaultdict(lambda: [0, 0.0])})
    for e in gpu:
        k = kinds[kernel_kind(e["name"], e["cat"])]
        d = e.get("dur", 0)
        k["us"] += d
        k["count"] += 1
        t = launches.get(e.get("args", {}).get("correlation"))
        k["by_phase"][phase_at(t) if t is not None else "(unlabelled)"] += d
        kk = k["kernels"][e["name"]]
        kk[0] += 1
        kk[1] += d
    total = sum(k["us"] for k in kinds.values())
    out = []
    for name, k in sorted(kinds.items(), key=lambda kv: -kv[1]["us"]):
        out.append({"kind": name, "us": k["us"], "share": k["us"] / total if total else 0.0, "count": k["count"],
                    "by_phase": dict(sorted(k["by_phase"].items(), key=lambda kv: -kv[1])),
                    "top": [{"name": n, "calls": c, "us": us} for n, (c, us) in
                            sorted(k["kernels"].items(), key=lambda kv: -kv[1][1])[:5]]})
    return {"kernel_us": total, "kinds": out}


def mix_report(mix: dict) -> str:
    out = [f"device time by kind of kernel ({mix['kernel_us'] / 1e3:.1f} ms of kernels):",
           f"  {'ms':>8} {'share':>6} {'calls':>6}  kind: by phase"]
    for k in mix["kinds"]:
        phases = ", ".join(f"{p.replace('step: ', '')} {us / 1e3:.1f}" for p, us in k["by_phase"].items())
        out.append(f"  {k['us'] / 1e3:8.1f} {k['share']:6.1%} {k['count']:6d}  {k['kind']}: {phases}")
        for t in k["top"][:3]:
            out.append(f"  {'':8} {'':6} {t['calls']:6d}    {t['us'] / 1e3:7.1f} ms  {t['name'][:80]}")
    return "\n".join(out)


def report(res: dict, top: int) -> str:
    out = [f"step wall {res['wall_us'] / 1e3:.1f} ms; device busy {res['device_busy_us'] / 1e3:.1f} ms "
           f"({res['device_busy_share']:.1%}); idle {res['idle_us'] / 1e3:.1f} ms, of it "
           f"{res['gaps_counted_us'] / 1e3:.1f} ms in {res['gaps_counted']} gaps of >= {res['min_gap_us']:g} us"]
    out.append("\nidle by the phase and operator that ended it:")
    out.append(f"  {'ms':>8} {'gaps':>5}  phase / operator")
    for c in res["by_cause"][:top]:
        out.append(f"  {c['us'] / 1e3:8.2f} {c['gaps']:5d}  {c['phase']} / {c['op']}")
    out.append(f"\nthe {top} largest gaps:")
    for r in res["largest"][:top]:
        host = ", ".join(f"{k} {v / 1e3:.2f} ms" for k, v in r["host"].items()) or "-"
        out.append(f"  {r['gap_us'] / 1e3:7.2f} ms at {r['start_us'] / 1e3:8.1f} ms  {r['phase']} / {r['op'] or '-'}"
                   f"\n      after {r['before'][:70]}\n      before {r['after'][:70]}\n      host in: {host}")
    out.append("\nruntime calls of the step (all threads):")
    for c in res["runtime_calls"][:12]:
        out.append(f"  {c['us'] / 1e3:8.2f} ms {c['calls']:6d}x  {c['name']}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a Chrome trace from --profile_trace (.json or .json.gz)")
    p.add_argument("--min-gap-us", type=float, default=20.0, help="shortest gap listed (default 20 us)")
    p.add_argument("--top", type=int, default=25, help="rows of each table (default 25)")
    p.add_argument("--kernels", action="store_true", help="also the device time by kind of kernel and phase")
    p.add_argument("--json", default=None, help="also write the analysis here")
    a = p.parse_args(argv)
    events = load(a.trace)
    res = analyse(events, a.min_gap_us)
    print(report(res, a.top))
    if a.kernels:
        res["kernel_mix"] = kernel_mix(events)
        print("\n" + mix_report(res["kernel_mix"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({**res, "largest": res["largest"][:200]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
