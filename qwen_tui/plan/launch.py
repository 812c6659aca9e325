"""Preset (+ what the checks learned) -> LaunchPlan: the exact command and
environment of every node. Pure: no I/O, no clock, no randomness.

The TUI, `qwen-tui replay`, `--dry-run` and every export render this one plan, so a
preset replayed headless does exactly what the wizard would have done.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import asdict, dataclass, field
from typing import Any

from ..base.shell import quote_argv
from ..cluster.facts import ClusterFacts
from ..cluster.ib import active_ports, nccl_ib_env
from ..preset.schema import Node, Preset, Training
from .container import container_name, env_names, run_mounts, runtime_prefix

# Where a remote node keeps its part of a run, relative to the node's workdir.
REMOTE_RUNS = ".qwen-tui/runs"
METRICS_NAME = "metrics.jsonl"
HEARTBEAT_NAME = "heartbeat"  # each node's ranks write rank-<R>.json and stack-rank-<R>.txt there
# torchrun's static rendezvous waits 900 s for a missing node unless told otherwise.
_RDZV_KEY = "timeout"


@dataclass
class NodeCommand:
    rank: int  # node rank; node 0 is the master
    label: str
    host: str
    local: bool
    nproc: int
    workdir: str
    run_dir: str  # where this node's log and exit code live (on that node)
    env: dict[str, str]
    argv: list[str]  # the worker's command: inside the container where there is one
    # the container runtime's command that argv runs after (plan/container.py); empty: on the node itself
    container: list[str] = field(default_factory=list)

    @property
    def command(self) -> list[str]:
        """What the node runs: argv, inside its container where the preset names one."""
        return [*self.container, *self.argv]

    @property
    def log_path(self) -> str:
        return posixpath.join(self.run_dir, f"node-{self.rank}.log")

    @property
    def rc_path(self) -> str:
        return posixpath.join(self.run_dir, f"node-{self.rank}.rc")

    @property
    def heartbeat_dir(self) -> str:
        """Where this node's ranks write their heartbeats and stacks (the worker's --heartbeat_dir)."""
        return posixpath.join(self.run_dir, HEARTBEAT_NAME)

    def shell_line(self) -> str:
        """One line a person can paste into a shell on that node. A secret's value is not
        in it: it reads the variable from that shell's environment. Control characters
        are shown escaped (redact.printable), so the line is safe to print."""
        from ..base.redact import is_secret, printable

        envs = [f'{k}="${k}"' if is_secret(k) else quote_argv([f"{k}={v}"]) for k, v in self.env.items()]
        return printable(f"cd {quote_argv([self.workdir])} && env " + " ".join([*envs, quote_argv(self.command)]))


@dataclass
class LaunchPlan:
    run_id: str
    nnodes: int
    world_size: int
    master_addr: str
    master_port: int
    backend: str
    effective_batch_size: int
    batch_formula: str
    metrics_file: str  # on the master node
    output_dir: str
    nodes: list[NodeCommand] = field(default_factory=list)
    monitor: dict[str, Any] = field(default_factory=dict)  # the preset's monitor section (run/watch/watchdog.py)
    # who gave the nodes: {} over SSH; {"kind": "slurm", "job_id": ...} for a SLURM allocation (run/slurm/)
    scheduler: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LaunchPlan":
        d = dict(d)
        d["nodes"] = [NodeCommand(**n) for n in d["nodes"]]
        return cls(**d)


def worker_args(t: Training, *, metrics_file: str, save_on_each_node: bool = False,
                ddp_timeout: int | None = None) -> list[str]:
    """The worker's argv after `-m training.finetune`, by the worker's own flag names."""

    data = ["--data_path", t.data] if t.data else \
        ["--datasets", json.dumps([s.worker_spec() for s in t.datasets or []], separators=(",", ":"))]
    a = [
        "--model_name_or_path", t.model,
        *data,
        "--output_dir", t.output_dir,
        "--model_max_length", str(t.model_max_length),
        "--per_device_train_batch_size", str(t.per_device_train_batch_size),
        "--gradient_accumulation_steps", str(t.gradient_accumulation_steps),
        "--learning_rate", repr(t.learning_rate),
        "--num_train_epochs", repr(t.num_train_epochs),
        "--max_steps", str(t.max_steps),
        "--warmup_ratio", repr(t.warmup_ratio),
        "--lr_scheduler_type", t.lr_scheduler_type,
        "--weight_decay", repr(t.weight_decay),
        "--save_strategy", t.save_strategy,
        "--save_steps", str(t.save_steps),
        "--logging_steps", str(t.logging_steps),
        "--seed", str(t.seed),
        "--metrics_file", metrics_file,
    ]
    if t.eval_data:
        a += ["--eval_data_path", t.eval_data]
        if t.eval_steps:
            a += ["--eval_steps", str(t.eval_steps)]
    if t.save_total_limit is not None:
        a += ["--save_total_limit", str(t.save_total_limit)]
    if t.precision == "bf16":
        a.append("--bf16")
    elif t.precision == "fp16":
        a.append("--fp16")
    if t.fp8 != "auto":  # auto is the worker's own default
        a += ["--fp8", t.fp8]
    if t.gradient_checkpointing:
        a.append("--gradient_checkpointing")
    if t.method in ("lora", "qlora"):
        a += ["--use_lora", "--lora_r", str(t.lora_r), "--lora_alpha", str(t.lora_alpha),
              "--lora_dropout", repr(t.lora_dropout)]
        if t.lora_target_modules:
            a += ["--lora_target_modules", ",".join(t.lora_target_modules)]
        if t.method == "qlora":
            a.append("--q_lora")
        if t.merge_lora:
            a.append("--merge_lora")
    if t.sequence_parallel_size > 1:
        a += ["--sequence_parallel_size", str(t.sequence_parallel_size)]
    if t.zero_stage is not None:
        name = f"zero{t.zero_stage}" + ("" if t.offload == "none" else f"_offload_{t.offload}")
        a += ["--deepspeed", f"builtin:{name}"]
    if t.resume_from_checkpoint:
        a += ["--resume_from_checkpoint", t.resume_from_checkpoint]
    if t.lazy_preprocess:
        a.append("--lazy_preprocess")
    if t.tokenized_cache_dir:
        a += ["--tokenized_cache_dir", t.tokenized_cache_dir]
    if t.device == "cpu":
        a.append("--use_cpu")
    if save_on_each_node:
        a.append("--save_on_each_node")
    if ddp_timeout is not None:
        a += ["--ddp_timeout", str(ddp_timeout)]
    if t.report_to:
        a += ["--report_to", ",".join(t.report_to)]
    if t.data_format != "auto":
        a += ["--data_format", t.data_format]
    if t.stage != "sft":
        a += ["--stage", t.stage, "--pref_beta", repr(t.pref_beta), "--pref_loss", t.pref_loss]
        if t.pref_ftx:
            a += ["--pref_ftx", repr(t.pref_ftx)]
    return a + list(t.extra_args)


def _backend(preset: Preset) -> str:
    if preset.network.backend != "auto":
        return preset.network.backend
    return "gloo" if preset.training.device == "cpu" else "nccl"


def _interface(preset: Preset, facts: ClusterFacts | None, rank: int) -> str | None:
    if preset.network.interface:
        return preset.network.interface
    nf = facts.nodes.get(rank) if facts else None
    return nf.route_interface if nf else None


def _ib_disable(preset: Preset, facts: ClusterFacts | None, rank: int) -> bool | None:
    if preset.network.nccl_ib_disable is not None:
        return preset.network.nccl_ib_disable
    nf = facts.nodes.get(rank) if facts else None
    if nf is None or nf.gpus is None:
        return None
    if nf.ib_ports:  # ports known: an HCA whose every port is down is no use to NCCL
        return not active_ports(nf.ib_ports)
    return not nf.ib_devices


def _ib_env(facts: ClusterFacts | None, rank: int) -> dict[str, str]:
    """NCCL_IB_HCA / NCCL_IB_GID_INDEX from the node's probed ports; network.env, applied after, wins."""
    nf = facts.nodes.get(rank) if facts else None
    return nccl_ib_env(nf.ib_ports) if nf is not None else {}


def _gpus_in_container(preset: Preset, facts: ClusterFacts | None, rank: int) -> bool:
    """Hand the node's GPUs to its container, unless the run is on CPU or the probe found none there."""
    nf = facts.nodes.get(rank) if facts else None
    return preset.training.device != "cpu" and not (nf is not None and nf.gpus == [])


def node_run_dir(node: Node, run_id: str, local_run_dir: str) -> str:
    """Where a node's log and exit code live: <workdir>/.qwen-tui/runs/<id> on a remote node
    (a relative workdir is taken from the login directory, as every remote path is)."""
    if node.is_local:
        return local_run_dir
    return posixpath.normpath(posixpath.join(node.workdir, REMOTE_RUNS, run_id))


def make_plan(preset: Preset, *, run_id: str, local_run_dir: str, base_dir: str = ".",
              facts: ClusterFacts | None = None, local_python: str | None = None) -> LaunchPlan:
    """Build the plan. `local_run_dir` is the run directory on this machine (absolute),
    `base_dir` the directory relative local workdirs are taken from, `local_python`
    the interpreter local nodes use when the preset leaves `python` at its default
    (qwen-tui's own, so a venv need not be activated)."""
    nodes = preset.slots
    backend = _backend(preset)
    master_addr = preset.master_addr
    port = preset.network.master_port
    master = nodes[0]
    metrics_file = posixpath.join(node_run_dir(master, run_id, local_run_dir), METRICS_NAME)  # where qwen-tui reads
    # the master's worker resolves a relative path against its workdir, not the login directory
    worker_metrics = metrics_file if master.is_local or posixpath.isabs(metrics_file) else \
        posixpath.join(REMOTE_RUNS, run_id, METRICS_NAME)
    shared = preset.cluster.shared_storage or all(n.is_local for n in nodes)
    wargs = worker_args(preset.training, metrics_file=worker_metrics, save_on_each_node=not shared and len(nodes) > 1,
                        ddp_timeout=preset.network.nccl_timeout)
    t = preset.training
    ebs = preset.effective_batch_size
    formula = preset.batch_formula

    cmds = []
    # Several local "nodes" on one GPU host each get their own GPUs, in node order.
    split_gpus = preset.training.device != "cpu" and sum(n.is_local for n in nodes) > 1
    next_gpu = 0
    for rank, node in enumerate(nodes):
        env = {
            "NNODES": str(len(nodes)),
            "NODE_RANK": str(rank),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(port),
            "GPUS_PER_NODE": str(node.gpus),
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
            "PYTHONUNBUFFERED": "1",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        }
        if backend == "gloo" and node.is_local and sum(n.is_local for n in nodes) > 1:
            # several CPU "nodes" on one host would fight over its cores
            env["OMP_NUM_THREADS"] = "1"
        iface = _interface(preset, facts, rank)
        if iface:
            env["GLOO_SOCKET_IFNAME"] = iface
            env["NCCL_SOCKET_IFNAME"] = iface
        ib = _ib_disable(preset, facts, rank)
        if ib is not None and backend == "nccl":
            env["NCCL_IB_DISABLE"] = "1" if ib else "0"
            if not ib:
                env.update(_ib_env(facts, rank))
        if split_gpus and node.is_local:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(next_gpu + i) for i in range(node.gpus))
            next_gpu += node.gpus
        env.update(preset.network.env)
        python = node.python_for(local_python)
        if preset.container is not None:  # the image's Python, with the container's own variables
            python = preset.container.python
            env.update(preset.container.env)
        argv = [
            python, "-m", "torch.distributed.run",
            "--nnodes", str(len(nodes)),
            "--node_rank", str(rank),
            "--nproc_per_node", str(node.gpus),
            "--master_addr", master_addr,
            "--master_port", str(port),
            "--rdzv-conf", f"{_RDZV_KEY}={preset.network.rdzv_timeout}",
            "--max-restarts", "0",
            "-m", "training.finetune", *wargs,
        ]
        # the worker resolves a relative path against its workdir, as for the metrics file above
        run_dir = node_run_dir(node, run_id, local_run_dir)
        beats = posixpath.join(run_dir if node.is_local or posixpath.isabs(run_dir) else
                               posixpath.join(REMOTE_RUNS, run_id), HEARTBEAT_NAME)
        argv += ["--heartbeat_dir", beats]
        workdir = node.workdir
        if node.is_local and not posixpath.isabs(workdir):
            workdir = posixpath.normpath(posixpath.join(base_dir, workdir))
        container: list[str] = []
        if preset.container is not None:
            mounts, make = run_mounts(preset, workdir, run_dir, env)
            container = runtime_prefix(preset.container, name=container_name(run_id, rank), workdir=workdir,
                                       mounts=mounts, env=env_names(env, preset.container),
                                       gpus=_gpus_in_container(preset, facts, rank),
                                       infiniband=backend == "nccl" and ib is False, make_dirs=make,
                                       node=node.host)
        cmds.append(NodeCommand(rank=rank, label=node.label, host=node.host, local=node.is_local,
                                nproc=node.gpus, workdir=workdir,
                                run_dir=run_dir, env=env, argv=argv, container=container))
    return LaunchPlan(run_id=run_id, nnodes=len(nodes), world_size=preset.world_size, master_addr=master_addr,
                      master_port=port, backend=backend, effective_batch_size=ebs, batch_formula=formula,
                      metrics_file=metrics_file, output_dir=t.output_dir, nodes=cmds,
                      monitor=preset.monitor.model_dump(mode="json"),
                      scheduler={"kind": "slurm", "job_id": preset.scheduler.job_id} if preset.scheduler.is_slurm
                      else {})
