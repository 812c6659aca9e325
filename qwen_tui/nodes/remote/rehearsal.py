# The rehearsal's job (qwen_tui.run.rehearsal), run in every rank by torchrun --no-python with the node's
# training Python (it imports torch): PROGRAM SIZE_MB TIMEOUT_S BUDGET_S, backend in $QT_BACKEND.
# Meets the other ranks, times an all-reduce and prints one line "QT_REHEARSAL {json}"; exit 3 when the
# all-reduce's sum is wrong.

import datetime, json, math, os, sys, time
t0 = time.time()
import torch, torch.distributed as dist
size_mb, timeout, budget = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
backend = os.environ["QT_BACKEND"]
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
met = time.time()
rank, world = dist.get_rank(), dist.get_world_size()
dev = "cpu"
if backend == "nccl":
    dev = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"; torch.cuda.set_device(dev)
def sync():
    if backend == "nccl": torch.cuda.synchronize()
# A small all-reduce first: a slow link would take minutes at the full size. The size shrinks (and is reported)
# so that one all-reduce stays within the budget; every rank agrees on it (the slowest rank's probe decides).
probe = torch.ones(max(1, int(1 * 2**20 / 4)), device=dev)
dist.all_reduce(probe); sync()
t = time.time(); dist.all_reduce(probe); sync()
rate = torch.tensor([probe.numel() * 4 / max(time.time() - t, 1e-6)], device=dev)
dist.all_reduce(rate, op=dist.ReduceOp.MIN)
fit_mb = float(rate[0]) * budget / 2**20
mb = size_mb if fit_mb >= size_mb else max(1.0, 2 ** int(math.log2(max(fit_mb, 1.0))))
x = torch.ones(max(1, int(mb * 2**20 / 4)), device=dev)
dist.all_reduce(x)
n = 3
sync()
t = time.time()
for _ in range(n):
    dist.all_reduce(x)
sync()
dt = (time.time() - t) / n
expect = float(world) ** (n + 1)
ok = abs(float(x[0]) - expect) <= 1e-3 * expect
busbw = 2 * (world - 1) / world * x.numel() * 4 * 8 / dt / 1e9 if world > 1 else None
print("QT_REHEARSAL " + json.dumps({"rank": rank, "world": world, "meet_s": met - t0, "allreduce_s": dt,
      "busbw_gbps": busbw, "size_mb": mb, "correct": ok, "host": os.uname().nodename}), flush=True)
dist.barrier()
dist.destroy_process_group()
sys.exit(0 if ok else 3)
