"""One rank of the GPU proof's collectives line: all-reduce and all-gather bus bandwidth as nccl-tests reports it.

    torchrun --nproc_per_node N bench/proof_collectives.py --json OUT [--sizes-mb 64,256,1024] [--iters 20]

For every message size: a few warm-up calls, then `iters` timed calls (CUDA events on GPUs, the wall clock on
CPU), the mean time t of one call. nccl-tests' definitions, with S the bytes of the whole message (all-reduce:
the buffer each rank holds; all-gather: the gathered buffer, N times a rank's part):

    algbw = S / t        all-reduce busbw = algbw * 2 (N - 1) / N        all-gather busbw = algbw * (N - 1) / N

Each call's result is checked (the sum of every rank's values; each rank's part in its place), so a figure
comes only from collectives that gave the right answer. Rank 0 writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--sizes-mb", default="64,256,1024", help="message sizes in MiB (default 64,256,1024)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and os.environ.get("QT_PROOF_CPU") != "1"
    backend = "nccl" if cuda else "gloo"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, device_id=dev if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    # torch 2.13 renamed all_gather_into_tensor (older torch, as on the GPU image, has only that name)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def timed(fn, iters: int) -> float:
        for _ in range(args.warmup):
            fn()
        sync()
        dist.barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            sync()
            return start.elapsed_time(end) / 1e3 / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters

    results = []
    for mb in (float(x) for x in args.sizes_mb.split(",")):
        n = int(mb * 2**20) // 4 // world * world  # fp32 elements, a multiple of the world size
        # all-reduce: every rank holds rank+1 everywhere; the sum is world (world + 1) / 2
        buf = torch.full((n,), float(rank + 1), device=dev)
        t_ar = timed(lambda b=buf: dist.all_reduce(b), args.iters)
        buf.fill_(float(rank + 1))
        dist.all_reduce(buf)
        sync()
        ar_ok = bool(torch.all(buf == world * (world + 1) / 2).item())
        # all-gather: each rank contributes its rank; the output holds every rank's part in order
        part = torch.full((n // world,), float(rank), device=dev)
        out = torch.empty((n,), device=dev)
        t_ag = timed(lambda o=out, i=part: gather(o, i), args.iters)
        want = torch.arange(world, device=dev, dtype=out.dtype).repeat_interleave(n // world)
        ag_ok = bool(torch.equal(out, want))
        size = n * 4
        # the slowest rank's time is the collective's
        times = torch.tensor([t_ar, t_ag], device=dev)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        t_ar, t_ag = (float(x) for x in times.tolist())
        oks = torch.tensor([int(ar_ok), int(ag_ok)], device=dev)
        dist.all_reduce(oks, op=dist.ReduceOp.MIN)
        results.append({
            "size_bytes": size, "all_reduce_s": t_ar, "all_gather_s": t_ag,
            "all_reduce_busbw_gbs": size / t_ar * 2 * (world - 1) / world / 1e9,
            "all_gather_busbw_gbs": size / t_ag * (world - 1) / world / 1e9,
            "all_reduce_correct": bool(oks[0].item()), "all_gather_correct": bool(oks[1].item()),
        })
    if rank == 0:
        with open(args.json, "w") as f:
            json.dump({"backend": backend, "world_size": world, "iters": args.iters, "sizes": results}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
