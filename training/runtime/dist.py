"""Process-group set-up and the few collectives the recipe needs.

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT; torch itself honours GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME. A
plain `python -m training.finetune` is one process of a world of one; it gets
a process group only when DeepSpeed needs one (on a free local port).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int = 0  # torchrun's GROUP_RANK

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def read_env() -> DistEnv:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return DistEnv(
        rank=int(os.environ.get("RANK", "0")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        world_size=world,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(world))),
        node_rank=int(os.environ.get("GROUP_RANK") or 0),
    )


def pick_device(env: DistEnv, use_cpu: bool) -> torch.device:
    if use_cpu or not torch.cuda.is_available():
        return torch.device("cpu")
    torch.cuda.set_device(env.local_rank)
    return torch.device("cuda", env.local_rank)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FR_PIPE_STEM = "nccl_trace_pipe_rank_"  # qwen_tui/run/watch/stacks.py writes to <stem><RANK>.pipe


def flight_recorder_defaults(trace_dir: str | None) -> None:
    """PyTorch's NCCL flight recorder on by default (CUDA, before the process group): the last 2,000 collectives
    of each rank, dumped when one times out, to DIR/nccl_trace_rank_<RANK> with --heartbeat_dir (else torch's
    default place). Set under torch's TORCH_FR_* names: the older TORCH_NCCL_* ones make every rank warn that
    they are deprecated. A user's own values win, under either name."""
    if not {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"} & os.environ.keys():
        os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    if trace_dir and not {"TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"} & os.environ.keys():
        os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(os.path.abspath(trace_dir), "nccl_trace_rank_")
    # A named pipe per rank (DIR/nccl_trace_pipe_rank_<RANK>.pipe) that NCCL's own monitor thread reads: a write to
    # it dumps the recorder now, without the GIL, while the rank hangs (qwen_tui/run/watch/stacks.py asks on a HANG).
    if trace_dir and not {"TORCH_FR_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"} & os.environ.keys():
        os.environ["TORCH_FR_DEBUG_INFO_PIPE_FILE"] = os.path.join(os.path.abspath(trace_dir), FR_PIPE_STEM)


def init(env: DistEnv, device: torch.device, timeout_s: int, need_group: bool) -> None:
    """Creates the process group (gloo on CPU, nccl on GPU) with a bounded wait."""
    if dist.is_initialized() or not (need_group or env.world_size > 1):
        return
    if env.world_size == 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s),
                            rank=env.rank, world_size=env.world_size, **kwargs)


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    if active():
        dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    if active():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def cpu_group(timeout_s: int):
    """A gloo group of its own for the packing thread's small host-side collectives (rows and token counts of
    the next step). On the default group they would queue behind the GPU work on the NCCL stream, and reading
    them back would wait for all of it; and a second thread must not share the default group's order.
    None without a process group of several ranks."""
    if not active() or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


def gather_floats(values: list[float], group) -> list[list[float]]:
    """Every rank's `values` (the same length everywhere), in rank order, through `group` on the host."""
    t = torch.tensor(values, dtype=torch.float64)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t, group=group)
    return [o.tolist() for o in out]


def all_gather_floats(x: float, device: torch.device) -> list[float]:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    if not active():
        return [x]
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.item() for o in out]


def destroy() -> None:
    if active():
        dist.destroy_process_group()
