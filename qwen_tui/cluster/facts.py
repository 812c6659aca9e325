"""What the checks learned about the nodes: plain data shared by probe, netcheck,
advice, estimate and plan. No I/O here.

Everything is keyed by node index (the position in `preset.cluster.nodes`, which is
also the node rank), so two local "nodes" on one host stay distinct.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GPU:
    index: int
    name: str  # "NVIDIA H200"
    memory_total_mib: int
    uuid: str = ""


@dataclass
class FileFact:
    """A data file or model directory as seen on one node."""

    path: str
    exists: bool
    size_bytes: int = 0
    sha256: str | None = None  # of the file, or of the sorted (name, size, sha256) list of a directory


@dataclass
class IBPort:
    """One InfiniBand/RoCE HCA port as the probe found it (qwen_tui/cluster/ib.py)."""

    hca: str  # mlx5_0
    port: int
    state: str  # ACTIVE, DOWN, INIT, ...
    link_layer: str  # InfiniBand | Ethernet (RoCE)
    rate: str | None = None  # "400 Gb/sec (4X NDR)"
    gid_index: int | None = None  # RoCE: the GID NCCL should use (NCCL_IB_GID_INDEX)
    gid_type: str | None = None  # "RoCE v2"
    netdev: str | None = None  # the Ethernet/IPoIB interface on top of it


@dataclass
class GPULink:
    """How two GPUs of one node reach each other, from `nvidia-smi topo -m` (and `topo -p2p`)."""

    a: int
    b: int
    link: str  # X, NV<n> (n bonded NVLinks), PIX, PXB, PHB, NODE, SYS
    p2p_read: str | None = None  # topo -p2p r: OK, CNS, GNS, TNS, NS, DR, U; None = not reported
    p2p_write: str | None = None  # topo -p2p w

    @property
    def nvlinks(self) -> int:
        """How many NVLinks join the two (0: PCIe only)."""
        return int(self.link[2:]) if self.link.startswith("NV") and self.link[2:].isdigit() else 0

    @property
    def p2p_ok(self) -> bool | None:
        """Whether the driver allows peer-to-peer both ways it reported; None when it reported nothing."""
        got = [s for s in (self.p2p_read, self.p2p_write) if s is not None]
        return None if not got else all(s == "OK" for s in got)


@dataclass
class GPUTopology:
    """One node's GPU matrix (qwen_tui/nodes/checks/topology.py parses and judges it)."""

    gpus: int
    links: list[GPULink] = field(default_factory=list)  # one per pair, a < b
    cpu_affinity: list[str | None] = field(default_factory=list)  # per GPU: "0-55,112-167"
    numa_affinity: list[str | None] = field(default_factory=list)  # per GPU: "0"; None = not reported

    def link(self, a: int, b: int) -> GPULink | None:
        lo, hi = min(a, b), max(a, b)
        return next((lk for lk in self.links if (lk.a, lk.b) == (lo, hi)), None)

    def among(self, n: int | None) -> list[GPULink]:
        """The pairs between the first `n` GPUs (all when None): the ones a run of n ranks uses."""
        k = self.gpus if n is None else min(n, self.gpus)
        return [lk for lk in self.links if lk.b < k]


@dataclass
class NodeFacts:
    """What one node's probe found. None means "not probed / unknown", not "absent"."""

    hostname: str | None = None
    addresses: dict[str, list[str]] = field(default_factory=dict)  # interface -> IPv4 addresses
    route_interface: str | None = None  # interface that routes to the master address
    gpus: list[GPU] | None = None  # [] = CPU-only node
    driver_version: str | None = None
    cuda_version: str | None = None
    ib_devices: list[str] = field(default_factory=list)
    ib_ports: list[IBPort] = field(default_factory=list)  # [] also when not probed for them (older facts)
    cpu_count: int | None = None
    memory_total_mib: int | None = None
    python_version: str | None = None
    # where the probe found itself running in a container, what says so (/run/.containerenv, /.dockerenv, ...)
    in_container: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)  # torch, transformers, peft, deepspeed, ... (None = missing)
    training_importable: bool | None = None
    disk_free_bytes: int | None = None  # in the output dir's filesystem
    shm_bytes: int | None = None  # size of /dev/shm (NCCL's shared memory, DataLoader workers)
    memlock_bytes: int | None = None  # ulimit -l (soft), -1 = unlimited
    open_files: int | None = None  # ulimit -n (soft), -1 = unlimited
    data: FileFact | None = None
    model: FileFact | None = None
    # the run's other data files, by the preset field that names them (eval_data, datasets.K.path, a mixture's
    # dataset_info and the file its entry names): each node opens its own copy, as it does training.data
    data_files: dict[str, FileFact] = field(default_factory=dict)
    missing_tools: list[str] = field(default_factory=list)  # e.g. ["iperf3", "nvidia-smi"]
    topology: GPUTopology | None = None  # nvidia-smi topo -m; None: no nvidia-smi, or not read
    topology_error: str | None = None  # why the matrix could not be read, when nvidia-smi was there
    error: str | None = None  # the probe itself failed (unreachable, auth, timeout)

    @property
    def gpu_count(self) -> int | None:
        return None if self.gpus is None else len(self.gpus)

    @property
    def gpu_model(self) -> str | None:
        if not self.gpus:
            return None
        return self.gpus[0].name

    @property
    def gpu_memory_gib(self) -> float | None:
        if not self.gpus:
            return None
        return min(g.memory_total_mib for g in self.gpus) / 1024


def file_fact(nf: NodeFacts | None, kind: str) -> FileFact | None:
    """What a node holds of one of the run's files: "data", "model", or a data_files field (eval_data, ...)."""
    if nf is None:
        return None
    return getattr(nf, kind) if kind in ("data", "model") else nf.data_files.get(kind)


@dataclass
class LinkFacts:
    """Network checks between the master (node 0) and one worker node."""

    port_reachable: bool | None = None  # master_port on the master, from this node
    port_error: str | None = None
    bandwidth_gbps: float | None = None  # iperf3, this node -> master
    bandwidth_error: str | None = None
    firewall: list[str] = field(default_factory=list)  # rules seen that may block the job's ports
    firewall_unread: str | None = None  # why the rules could not be read (None: read, or not looked at)


@dataclass
class ClusterFacts:
    nodes: dict[int, NodeFacts] = field(default_factory=dict)
    links: dict[int, LinkFacts] = field(default_factory=dict)  # worker index -> link to master
    master_port_free: bool | None = None
    shared_storage: bool | None = None  # measured: output_dir is one filesystem on all nodes
    rehearsal_ok: bool | None = None
    rehearsal_bandwidth_gbps: float | None = None  # all-reduce bus bandwidth (nccl-tests' busbw), Gbit/s
    rehearsal_size_mb: float | None = None  # the message it was measured at
    rehearsal_nodes: int | None = None  # nodes it spanned (1: a bandwidth inside one node, not between nodes)

    def min_bandwidth_gbps(self) -> float | None:
        vals = [lk.bandwidth_gbps for lk in self.links.values() if lk.bandwidth_gbps is not None]
        return min(vals) if vals else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def merged(self, new: "ClusterFacts") -> "ClusterFacts":
        """A copy of these facts updated with what `new` learned; what `new` did not look at (None,
        a node or link it has no entry for) keeps what these knew, e.g. the probe across a port check."""
        out = ClusterFacts.from_dict(self.to_dict())
        out.nodes.update(new.nodes)
        out.links.update(new.links)
        for k in ("master_port_free", "shared_storage", "rehearsal_ok", "rehearsal_bandwidth_gbps",
                  "rehearsal_size_mb", "rehearsal_nodes"):
            v = getattr(new, k)
            if v is not None:
                setattr(out, k, v)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ClusterFacts":
        def node(x: dict[str, Any]) -> NodeFacts:
            x = dict(x)
            if x.get("gpus") is not None:
                x["gpus"] = [GPU(**g) for g in x["gpus"]]
            x["ib_ports"] = [IBPort(**p) for p in x.get("ib_ports") or []]
            if x.get("topology") is not None:
                t = dict(x["topology"])
                t["links"] = [GPULink(**lk) for lk in t.get("links") or []]
                x["topology"] = GPUTopology(**t)
            for k in ("data", "model"):
                if x.get(k) is not None:
                    x[k] = FileFact(**x[k])
            x["data_files"] = {k: FileFact(**v) for k, v in (x.get("data_files") or {}).items()}
            return NodeFacts(**x)

        return cls(
            nodes={int(k): node(v) for k, v in d.get("nodes", {}).items()},
            links={int(k): LinkFacts(**v) for k, v in d.get("links", {}).items()},
            master_port_free=d.get("master_port_free"),
            shared_storage=d.get("shared_storage"),
            rehearsal_ok=d.get("rehearsal_ok"),
            rehearsal_bandwidth_gbps=d.get("rehearsal_bandwidth_gbps"),
            rehearsal_size_mb=d.get("rehearsal_size_mb"),
            rehearsal_nodes=d.get("rehearsal_nodes"),
        )
