"""The preset: one YAML file that says everything about a run. This module is its model: every section and
field, its defaults, and the validators that refuse a value naming the field. Reading and writing the file
(`load_preset`, `save_preset`) is files.py's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .scheduler import Scheduler
from .yaml_io import PresetError  # defined beside the YAML guards; everyone imports it from here

PRESET_VERSION = 1

# Host names, users and paths are passed to ssh/torchrun as quoted argv, never
# through a shell, so only what makes no sense anywhere (control characters) is refused here.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Node(_Strict):
    """One machine. `host` is an address, a DNS name, an ssh_config alias or `localhost`."""

    host: str = Field(min_length=1, description="address, DNS name, ssh_config alias, or localhost (a local \"node\": "
                      "a torchrun agent on this machine)")
    user: str | None = Field(default=None, description="SSH login; default from ssh_config, else yours")
    port: int = Field(default=22, ge=1, le=65535, description="SSH port")
    gpus: int = Field(default=1, ge=1, le=64, description="processes (GPUs) on this node")
    workdir: str = Field(default=".", min_length=1, description="directory the worker runs in")
    python: str = Field(default="python3", min_length=1, description="the node's Python")
    name: str | None = Field(default=None, description="label shown in the UI; default host")

    @field_validator("host", "user", "workdir", "python", "name")
    @classmethod
    def _no_control_chars(cls, v: str | None) -> str | None:
        if v is not None and _CONTROL.search(v):
            raise ValueError("must not contain control characters")
        return v

    @property
    def label(self) -> str:
        return self.name or self.host

    def python_for(self, local_python: str | None) -> str:
        """The interpreter a run uses here: a local node that names no python of its own
        runs `local_python` (qwen-tui's own). The checks probe the same one."""
        if self.is_local and local_python and "python" not in self.model_fields_set:
            return local_python
        return self.python

    @property
    def is_local(self) -> bool:
        return self.host in ("localhost", "127.0.0.1", "::1")


class Cluster(_Strict):
    nodes: list[Node] = Field(default_factory=list, description="the machines, node 0 first: the master, where "
                              "qwen-tui runs and rank 0 trains (with scheduler.kind slurm: none, SLURM gives them)")
    ssh_config: str | None = Field(default=None, description="ssh_config file; default ~/.ssh/config")
    identity_file: str | None = Field(default=None, description="private key; default from ssh_config or ~/.ssh/id_ed25519")
    known_hosts: str | None = Field(default=None, description="known_hosts file; default ~/.ssh/known_hosts")
    connect_timeout: float = Field(default=10.0, gt=0, le=300, description="seconds an SSH connection (each hop) "
                                   "may take before the node counts as unreachable")
    shared_storage: bool = Field(default=False, description="output_dir is on storage every node sees")


class Network(_Strict):
    master_addr: str | None = Field(default=None, description="address workers use to reach node 0; default its host")
    master_port: int = Field(default=29500, ge=1024, le=65535, description="the rendezvous port on node 0")
    backend: Literal["auto", "nccl", "gloo"] = Field(default="auto", description="process-group backend; auto: nccl "
                                                     "on GPUs, gloo on CPU")
    interface: str | None = Field(default=None, description="NCCL/GLOO_SOCKET_IFNAME for every node; default from the probe")
    nccl_ib_disable: bool | None = Field(
        default=None, description="NCCL_IB_DISABLE for every node; default from the HCAs the probe found (true: "
        "sockets between nodes on purpose)")
    rdzv_timeout: int = Field(default=60, ge=1, le=3600, description="seconds to wait for every node to join")
    nccl_timeout: int = Field(default=1800, ge=1, le=86400, description="seconds a collective may hang")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for every rank")

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
        return v


DATA_FORMATS = Literal["auto", "qwen", "sharegpt", "openai", "alpaca", "trl", "sharegpt_pref", "swift_pref"]


class DataSource(_Strict):
    """One source of a mixture (training.data.sources): a path, or an entry of LLaMA-Factory's dataset_info.json."""

    path: str | None = Field(default=None, min_length=1, description="JSON, JSONL, Parquet, Arrow, a save_to_disk "
                                "folder, or hf:ORG/NAME (downloaded on the master and synced by check --sync)")
    format: DATA_FORMATS = Field(default="auto", description="the records' format; auto: from each record's keys")
    weight: float | None = Field(default=None, gt=0, description="share of the mixture, against the others'")
    records: int | None = Field(default=None, ge=1, description="exactly this many records (repeats past the "
                                   "source's size)")
    name: str | None = Field(default=None, min_length=1, description="label; with dataset_info, the entry")
    dataset_info: str | None = Field(default=None, min_length=1, description="LLaMA-Factory's dataset_info.json")

    @model_validator(mode="after")
    def _one_way(self) -> "DataSource":
        if self.weight is not None and self.records is not None:
            raise ValueError("give weight or records, not both")
        if not self.path and not (self.dataset_info and self.name):
            raise ValueError("give path, or dataset_info and name")
        return self

    def worker_spec(self) -> dict:
        return self.model_dump(mode="json", exclude_none=True, exclude_defaults=True)


class Training(_Strict):
    """The worker's arguments, by the worker's own names where it has them."""

    model: str = Field(min_length=1, description="local dir, hub id, or builtin:tiny")
    data: str | None = Field(default=None, min_length=1, description="chat data (JSON, JSONL, Parquet, Arrow, a "
                                "saved data set, hf:ORG/NAME), builtin:demo-chat; DPO: preference pairs, "
                                "builtin:demo-pref; or datasets instead")
    datasets: list[DataSource] | None = Field(default=None, min_length=1, description="several sources mixed "
                                                 "instead of data")
    data_format: DATA_FORMATS = Field(default="auto", description="the records' format (qwen, sharegpt, openai, "
                                      "alpaca; DPO: trl, sharegpt_pref, swift_pref); auto: from each record's keys")
    stage: Literal["sft", "dpo"] = Field(default="sft", description="sft, or dpo on preference pairs (after SFT)")
    pref_beta: float = Field(default=0.1, gt=0, le=10, description="DPO's beta: how far from the reference")
    pref_loss: Literal["sigmoid", "ipo"] = Field(default="sigmoid", description="DPO's sigmoid loss, or IPO's on "
                                                 "per-token averages")
    pref_ftx: float = Field(default=0.0, ge=0, description="weight of an SFT term on the chosen answer")
    eval_data: str | None = Field(default=None, description="chat data for the eval loss (same formats as data)")
    eval_steps: int = Field(default=0, ge=0, description="evaluate on eval_data every N steps (0: at the end only)")
    output_dir: str = Field(default="output", min_length=1, description="checkpoints, the final model and "
                            "metrics.jsonl; relative to each node's workdir")
    method: Literal["full", "lora", "qlora"] = Field(default="lora", description="full fine-tuning, LoRA, or "
                                                     "Q-LoRA (a 4-bit base)")
    zero_stage: int | None = Field(default=2, description="DeepSpeed ZeRO stage 2 or 3; null for plain DDP")
    offload: Literal["none", "optimizer", "all"] = Field(default="none", description="ZeRO offload to host memory: "
                                                         "the optimizer states, or (ZeRO-3) the weights too")
    precision: Literal["bf16", "fp16", "fp32"] = Field(default="bf16", description="mixed-precision dtype; fp32 "
                                                       "on CPU")
    fp8: Literal["auto", "on", "off"] = Field(default="auto", description="FP8 matmuls (the worker's --fp8, "
                                              "torchao): auto only where measured faster through the worker "
                                              "(a 7B-class LoRA base without DeepSpeed, in rows "
                                              "of 8,192+ tokens), else bf16; on runs it anyway; off")
    device: Literal["auto", "cuda", "cpu"] = Field(default="auto", description="auto: CUDA where the nodes have "
                                                   "GPUs, else CPU over gloo")
    model_max_length: int = Field(default=2048, ge=8, le=1_048_576, description="tokens a record may have; longer "
                                  "records are cut (and counted)")
    per_device_train_batch_size: int = Field(default=1, ge=1, le=4096, description="records per process per "
                                             "micro-batch (with packing, records a step; rows are sized by memory)")
    gradient_accumulation_steps: int = Field(default=8, ge=1, le=4096, description="micro-batches per optimizer "
                                             "step")
    learning_rate: float = Field(default=2e-4, gt=0, lt=1, description="peak learning rate")
    num_train_epochs: float = Field(default=1.0, gt=0, description="epochs to train (max_steps wins when set)")
    max_steps: int = Field(default=-1, ge=-1, description="optimizer steps to train; -1: by num_train_epochs")
    warmup_ratio: float = Field(default=0.03, ge=0, le=1, description="share of the steps with a linear warm-up")
    lr_scheduler_type: Literal["cosine", "linear", "constant", "constant_with_warmup"] = Field(
        default="cosine", description="learning-rate schedule after the warm-up")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay (not on biases and norms)")
    gradient_checkpointing: bool = Field(default=True, description="recompute activations in the backward to save "
                                         "memory (the estimate says when it is not needed)")
    sequence_parallel_size: int = Field(default=1, ge=1, le=1024, description="ranks that share every packed row "
                                        "(DeepSpeed's Ulysses attention): records that many times longer fit; "
                                        "1: off")
    lora_r: int = Field(default=64, ge=1, le=4096, description="LoRA rank")
    lora_alpha: int = Field(default=16, ge=1, description="LoRA scaling numerator (the update is scaled by "
                            "alpha / r)")
    lora_dropout: float = Field(default=0.05, ge=0, lt=1, description="dropout on the adapters' inputs")
    lora_target_modules: list[str] | None = Field(
        default=None, description="modules LoRA adapts; default every linear projection (q, k, v, o, gate, up, "
        "down); on a mixture of experts the expert names reach every expert")
    save_strategy: Literal["steps", "epoch", "no"] = Field(default="steps", description="when checkpoints are "
                                                           "written")
    save_steps: int = Field(default=500, ge=1, description="a checkpoint every N optimizer steps")
    save_total_limit: int | None = Field(default=2, ge=1, description="checkpoints kept, the oldest deleted "
                                            "first; null keeps all")
    logging_steps: int = Field(default=1, ge=1, description="a metrics record every N optimizer steps")
    seed: int = Field(default=42, description="seed for initialisation, dropout and data order")
    resume_from_checkpoint: str | None = Field(
        default=None, description="a checkpoint directory, or auto: the newest complete on every node")
    lazy_preprocess: bool = Field(default=False, description="tokenize records as they are read rather than all "
                                  "up front (still validated up front)")
    tokenized_cache_dir: str | None = Field(
        default=None, description="where each node caches the tokenized data (the worker's default: "
        "$XDG_CACHE_HOME/qwen-tui/tokenized or ~/.cache/qwen-tui/tokenized); 'none' tokenizes on every rank")
    merge_lora: bool = Field(default=False, description="after a LoRA run, also save the merged model in "
                             "OUTPUT_DIR/merged")
    report_to: list[Literal["tensorboard", "wandb", "mlflow", "all"]] = Field(
        default_factory=list, description="trackers rank 0 also logs to (the worker's --report_to; none: [])")
    extra_args: list[str] = Field(default_factory=list, description="passed to the worker verbatim (as argv)")
    # Recovery is qwen-tui's, not the worker's: these never reach the worker's argv (run/recovery/restarts.py).
    restarts: int = Field(default=0, ge=0, le=100, description="relaunch from the last complete checkpoint up to "
                          "N times after a node fails")
    exclude_failed: bool = Field(default=False, description="relaunch without the failed node, keeping the "
                                 "global batch (replay --exclude-failed)")

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to(cls, v: Any) -> Any:
        # HF's spellings: "tensorboard", "tensorboard,wandb", "none", or a list of names
        if isinstance(v, str):
            v = [n.strip() for n in v.split(",") if n.strip()]
        if isinstance(v, list) and [str(n).lower() for n in v] == ["none"]:
            return []
        return [n.lower() if isinstance(n, str) else n for n in v] if isinstance(v, list) else v

    @field_validator("fp8", mode="before")
    @classmethod
    def _fp8(cls, v: Any) -> Any:
        # YAML 1.1 reads an unquoted on / off as a boolean: `fp8: on` means on
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("zero_stage")
    @classmethod
    def _zero(cls, v: int | None) -> int | None:
        if v is not None and v not in (2, 3):
            raise ValueError(f"must be 2 or 3 (or null for plain DDP), got {v}")
        return v


class Monitor(_Strict):
    """How qwen-tui watches a running job (run/watch/health.py, run/watch/watchdog.py): when a node it cannot read is
    given up on, when a run that makes no progress is called hung, and when a node counts as slow."""

    unreachable_timeout: int = Field(
        default=120, ge=5, le=7 * 86400,
        description="seconds a node may stay unreachable over SSH before on_unreachable applies; its training "
        "goes on meanwhile")
    on_unreachable: Literal["stop", "keep"] = Field(
        default="stop", description="at the bound: stop every node (the run fails, and training.restarts may "
        "relaunch it), or keep the run and keep trying to reach the node")
    hang_timeout: int | None = Field(
        default=None, ge=10, le=7 * 86400,
        description="seconds without a finished step before the run counts as hung (default: 5 x the median "
        "step time, at least 120 s; checkpoints and evaluations get 10 times as long)")
    on_hang: Literal["alert", "stop", "restart"] = Field(
        default="alert", description="what a hang does once its stacks are collected: alert only, stop every "
        "node, or stop and relaunch from the last checkpoint (needs training.restarts)")
    straggler_threshold: float = Field(
        default=0.2, gt=0, le=10,
        description="a node whose compute time per step exceeds the other nodes' median by this fraction, "
        "for straggler_steps logged steps in a row, is named a straggler")
    straggler_steps: int = Field(default=3, ge=1, le=1000,
                                 description="logged steps in a row a node must be slow before it is named")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Limits a runtime's --ulimit knows (docker run --ulimit and podman run --ulimit take the same names).
ULIMIT_NAMES = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss",
                "rtprio", "rttime", "sigpending", "stack")


class Container(_Strict):
    """Each node's job inside a container image (docs/containers.md). The flags multi-node training needs
    (host network, PID and IPC namespaces, unlimited memlock, the GPUs, InfiniBand where the node has it, the
    workdir, run directory and the run's paths mounted, the job's environment passed by name) are qwen-tui's
    to set (plan/container.py); these fields say only what differs between sites."""

    runtime: Literal["podman", "docker", "apptainer", "enroot", "pyxis"] = Field(
        description="the container runtime on every node (pyxis: srun's --container-image, under SLURM only)")
    image: str = Field(min_length=1, description="podman/docker: an image on each node (never pulled); apptainer: "
                       "a .sif file (or a sandbox directory); enroot: a .sqsh file or a container from enroot "
                       "create; pyxis: a .sqsh file on the nodes or an image it imports (nvcr.io#nvidia/pytorch:"
                       "24.12-py3)")
    mounts: list[str] = Field(default_factory=list, description="more bind mounts, HOST[:CONTAINER][:ro], "
                              "absolute paths (the workdir, run directory and the run's own paths are mounted "
                              "already)")
    env: dict[str, str] = Field(default_factory=dict, description="variables set inside the container only")
    pass_env: list[str] = Field(default_factory=list, description="names of variables passed in from the node's "
                                "environment as they are there (HF_TOKEN, WANDB_API_KEY): by name, never written")
    python: str = Field(default="python3", min_length=1, description="the image's Python")
    ulimits: dict[str, str] = Field(default_factory=dict, description="podman/docker --ulimit NAME=SOFT[:HARD] "
                                    "on top of memlock=-1:-1 (unlimited, for NCCL's pinned memory); 'host' keeps "
                                    "the node's own limit")
    extra_args: list[str] = Field(default_factory=list, description="more flags for the runtime's run command, "
                                  "verbatim, before the image (pyxis: srun's, e.g. --container-writable)")

    @field_validator("image", "python")
    @classmethod
    def _one_word(cls, v: str) -> str:
        if _CONTROL.search(v) or re.search(r"\s", v):
            raise ValueError("must be one word, without spaces or control characters")
        if v.startswith("-"):
            raise ValueError(f"must not start with '-' (the runtime would read {v!r} as a flag)")
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            parts = m.split(":")
            if _CONTROL.search(m) or "," in m:
                raise ValueError(f"{m!r}: no commas or control characters (apptainer's --bind splits on commas)")
            opts = parts[2] if len(parts) == 3 else (parts[1] if len(parts) == 2 and not parts[1].startswith("/")
                                                     else None)
            paths = [p for p in parts if p != opts]
            if len(parts) > 3 or not paths or len(paths) > 2 or opts not in (None, "ro", "rw"):
                raise ValueError(f"{m!r}: must be HOST, HOST:CONTAINER, HOST:ro or HOST:CONTAINER:ro")
            for p in paths:
                if not p.startswith("/"):
                    raise ValueError(f"{m!r}: {p!r} is not an absolute path")
        return v

    @field_validator("env", "pass_env")
    @classmethod
    def _env_names(cls, v: dict[str, str] | list[str]) -> dict[str, str] | list[str]:
        for k in v:  # env's keys, pass_env's items
            if not _ENV_NAME.fullmatch(k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
        return v

    @field_validator("ulimits")
    @classmethod
    def _ulimits(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        runtime = info.data.get("runtime")
        if v and runtime in ("apptainer", "enroot", "pyxis"):
            raise ValueError(f"{runtime} has no --ulimit (its processes keep the node's limits: raise them in "
                             "/etc/security/limits.conf)")
        for k, val in v.items():
            if k not in ULIMIT_NAMES:
                raise ValueError(f"{k!r} is not a limit the runtimes know (one of {', '.join(ULIMIT_NAMES)})")
            if val != "host" and not re.fullmatch(r"-?\d+(:-?\d+)?", str(val)):
                raise ValueError(f"{k}: {val!r} must be SOFT[:HARD] (numbers, -1 for unlimited) or 'host'")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for a in v:
            if _CONTROL.search(a):
                raise ValueError(f"{a!r}: must not contain control characters")
        return v


class Preset(_Strict):
    version: int = Field(default=PRESET_VERSION, description="the preset format's version")
    name: str | None = Field(default=None, description="names the run and its run directory; default the "
                                "file's name")
    description: str | None = Field(default=None, description="a few lines for the reader; heads the saved "
                                       "file as comments")
    cluster: Cluster = Field(default_factory=Cluster, description="the nodes and how to reach them")
    network: Network = Field(default_factory=Network, description="rendezvous, backend, interfaces and the "
                             "environment of every rank")
    training: Training = Field(description="the model, the data and the worker's arguments")
    monitor: Monitor = Field(default_factory=Monitor, description="how qwen-tui watches a running job")
    scheduler: Scheduler = Field(default_factory=Scheduler, description="who gives the run its nodes: SSH (the "
                                 "nodes listed) or SLURM")
    container: Container | None = Field(default=None, description="run each node's job in this container image "
                                        "(docs/containers.md); none: on the node itself")

    @field_validator("name")
    @classmethod
    def _name_one_line(cls, v: str | None) -> str | None:
        # the name heads the saved preset's comment and names the run directory
        if v is not None and _CONTROL.search(v):
            raise ValueError("must not contain control characters (one line, no escapes)")
        return v

    @field_validator("description")
    @classmethod
    def _description_text(cls, v: str | None) -> str | None:
        if v is not None and re.search(r"[\x00-\x08\x0b-\x1f\x7f]", v):
            raise ValueError("must not contain control characters other than newlines and tabs")
        return v

    @field_validator("version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != PRESET_VERSION:
            raise ValueError(f"this qwen-tui reads preset version {PRESET_VERSION}, got {v}")
        return v

    @model_validator(mode="after")
    def _nodes_for_the_scheduler(self) -> "Preset":
        s = self.scheduler
        if not s.is_slurm and not self.cluster.nodes:
            raise ValueError("cluster.nodes: at least one node is needed (or scheduler.kind: slurm, to take the "
                             "nodes from SLURM)")
        if s.is_slurm and self.cluster.nodes and s.job_id is None:
            raise ValueError("cluster.nodes: a SLURM preset takes its nodes from SLURM: leave cluster.nodes out "
                             "and say how many with scheduler.nodes (scheduler.nodelist names particular ones)")
        if s.is_slurm and s.job_id is not None and len(self.cluster.nodes) < 1:
            raise ValueError("cluster.nodes: a run inside SLURM job "
                             f"{s.job_id} names the allocation's nodes")
        return self

    @model_validator(mode="after")
    def _eval_steps_need_eval_data(self) -> "Preset":
        if self.training.eval_steps and not self.training.eval_data:
            raise ValueError("training.eval_steps: evaluating every "
                             f"{self.training.eval_steps} steps needs training.eval_data (a chat file to evaluate on)")
        return self

    @model_validator(mode="after")
    def _data_or_datasets(self) -> "Preset":
        t = self.training
        if not t.data and not t.datasets:
            raise ValueError("training.data: is required (or training.datasets: several sources mixed)")
        if t.data and t.datasets:
            raise ValueError("training.datasets: training.data names the data too; keep one of them")
        return self

    @model_validator(mode="after")
    def _sequence_parallel_fits(self) -> "Preset":
        from ..model.seqparallel import sequence_parallel_problem

        problem = sequence_parallel_problem(self.training.sequence_parallel_size, self.world_size,
                                            self.training.model)
        if problem:
            raise ValueError(f"training.sequence_parallel_size: {problem}")
        return self

    @model_validator(mode="after")
    def _hang_restart_needs_restarts(self) -> "Preset":
        if self.monitor.on_hang == "restart" and not self.training.restarts:
            raise ValueError("monitor.on_hang: restart relaunches through training.restarts, which is 0 "
                             "(set training.restarts to 1 or more, or on_hang to alert or stop)")
        return self

    @model_validator(mode="after")
    def _pyxis_needs_slurm(self) -> "Preset":
        if self.container is not None and self.container.runtime == "pyxis" and not self.scheduler.is_slurm:
            raise ValueError("container.runtime: pyxis is srun's --container-image, so it needs scheduler.kind: "
                             "slurm (over SSH, enroot runs the same images: runtime: enroot)")
        return self

    @model_validator(mode="after")
    def _container_paths(self) -> "Preset":
        # The container sees the node's paths mounted at the same place: a path must mean one place on the node
        # before the job starts (a remote workdir relative to the login directory, or ~, is known only there).
        if self.container is None:
            return self
        for i, n in enumerate(self.cluster.nodes):
            if not n.is_local and not n.workdir.startswith("/"):
                raise ValueError(f"cluster.nodes.{i}.workdir: {n.workdir!r} is relative to the login directory; "
                                 "a container run mounts the workdir at the same path inside the image, so give "
                                 "it as an absolute path (/home/you/run, /shared/project)")
        t = self.training
        for name in ("model", "data", "eval_data", "output_dir", "tokenized_cache_dir", "resume_from_checkpoint"):
            v = getattr(t, name)
            if v is not None and v.startswith("~"):
                raise ValueError(f"training.{name}: {v!r}: inside a container ~ is the image's home, not the "
                                 "node's; give an absolute path or one relative to the workdir")
        return self

    @model_validator(mode="after")
    def _unique_nodes(self) -> "Preset":
        seen: dict[tuple[str, int], int] = {}
        for i, n in enumerate(self.cluster.nodes):
            if n.is_local:
                continue  # several local "nodes" are several torchrun agents on one machine
            key = (n.host, n.port)
            if key in seen:
                raise ValueError(f"cluster.nodes.{i}.host: {n.host}:{n.port} is also node {seen[key]}")
            seen[key] = i
        return self

    # Derived values every face shows the same way.
    @property
    def slots(self) -> list[Node]:
        """The nodes a run gets: cluster.nodes, or for a SLURM preset not yet inside an allocation as many
        stand-ins as scheduler.nodes asks for (their hosts are SLURM's to choose)."""
        if self.cluster.nodes:
            return list(self.cluster.nodes)
        s = self.scheduler
        return [Node(host=f"slurm-node-{i}", gpus=s.gpus_per_node, workdir=s.workdir, python=s.python)
                for i in range(s.nodes)]

    def on_nodes(self, hosts: list[str], job_id: str) -> "Preset":
        """This SLURM preset inside allocation `job_id`, whose nodes are `hosts` (SLURM's order: node 0 is the
        master): every node runs in scheduler.workdir with scheduler.python; the master address is node 0's
        unless network.master_addr names one."""
        s = self.scheduler
        nodes = [{"host": h, "gpus": s.gpus_per_node, "workdir": s.workdir, "python": s.python} for h in hosts]
        return self.with_changes({"cluster.nodes": nodes, "scheduler.job_id": job_id})

    @property
    def world_size(self) -> int:
        return sum(n.gpus for n in self.slots)

    @property
    def effective_batch_size(self) -> int:
        t = self.training
        # the ranks of a sequence-parallel group share their records: one replica of the data per group
        return t.per_device_train_batch_size * t.gradient_accumulation_steps * self.data_parallel_size

    @property
    def data_parallel_size(self) -> int:
        return max(1, self.world_size // self.training.sequence_parallel_size)

    @property
    def batch_formula(self) -> str:
        """How the effective batch size comes about, as the review, the plan and the exports print it."""
        t, nodes = self.training, self.slots
        gpus = [n.gpus for n in nodes]
        head = f"{t.per_device_train_batch_size} per device x {t.gradient_accumulation_steps} accumulation"
        if t.sequence_parallel_size > 1:
            return (f"{head} x {self.data_parallel_size} sequence-parallel groups ({self.world_size} GPUs / "
                    f"{t.sequence_parallel_size} a group) = {self.effective_batch_size}")
        if len(set(gpus)) != 1:
            return f"{head} x {self.world_size} GPUs in all = {self.effective_batch_size}"
        return f"{head} x {gpus[0]} GPUs per node x {len(nodes)} nodes = {self.effective_batch_size}"

    @property
    def master_addr(self) -> str:
        if self.network.master_addr:
            return self.network.master_addr
        host = self.slots[0].host
        return "127.0.0.1" if host == "localhost" else host

    # Edits by dotted path: the wizard's fields and the advice fixes both change a preset this way.
    def get_path(self, path: str) -> Any:
        """The value at a dotted path (`training.zero_stage`, `cluster.nodes.1.gpus`).
        Raises KeyError for a path that names no field, IndexError for a node that is not there."""
        cur: Any = self
        for p in path.split("."):
            if isinstance(cur, list):
                if not p.isdigit():
                    raise KeyError(f"{path}: {p!r} is not a list index")
                cur = cur[int(p)]
            elif isinstance(cur, BaseModel) and p in type(cur).model_fields:
                cur = getattr(cur, p)
            else:
                raise KeyError(f"{path}: no such preset field")
        return cur

    def with_changes(self, changes: dict[str, Any]) -> "Preset":
        """A new, validated Preset with `changes` ({"training.zero_stage": 3, "cluster.nodes": [...]})
        applied; this one is left as it was.

        Raises KeyError when a path names no field, and PresetError whose `field_errors` name the
        dotted path of each problem (so a form shows it next to its input) when a value is refused.
        Fields the preset leaves at their defaults stay unset (exclude_unset): a local node's `python`
        that the preset never gave must stay unset, or the plan runs "python3" there instead of
        qwen-tui's own interpreter."""
        import copy

        data = self.model_dump(mode="python", exclude_unset=True)
        for path, value in changes.items():
            self.get_path(path)  # the path must name a field of the model, set or not
            parts = [int(p) if p.isdigit() else p for p in path.split(".")]
            cur: Any = data
            for p in parts[:-1]:
                cur = cur[p] if isinstance(p, int) else cur.setdefault(p, {})
            cur[parts[-1]] = copy.deepcopy(value)
        try:
            return Preset.model_validate(data)
        except ValidationError as e:
            errs = []
            for err in e.errors():
                loc = ".".join(str(x) for x in err["loc"])
                msg = err["msg"].removeprefix("Value error, ")
                if not loc and ": " in msg:  # model-level validators carry the path in the message
                    loc, _, msg = msg.partition(": ")
                errs.append(FieldError(loc, msg))
            pe = PresetError([f"{fe.path}: {fe.message}" for fe in errs])
            pe.field_errors = errs  # type: ignore[attr-defined]
            raise pe from None


@dataclass(frozen=True)
class FieldError:
    """One refused value of an edit: its dotted path and why."""

    path: str  # dotted, e.g. "training.learning_rate"
    message: str
