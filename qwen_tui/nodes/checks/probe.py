"""Node probe: one Python snippet per node, run by the node's own Python, prints
one JSON object that becomes NodeFacts.

The snippet travels as an argv element (`python -c SNIPPET ARGS_JSON`), never
through a shell. It imports torch on the node (never in qwen-tui's process) and
hashes the data file and model directory there. nvidia-smi's CSV comes back raw
and is parsed here (`parse_gpu_csv`, tested on real H200 output), as do its
`topo -m` matrix and `topo -p2p r|w` answers (qwen_tui/nodes/checks/topology.py), each
bounded to 15 s; a node without nvidia-smi runs none of them.
"""

from __future__ import annotations

import json
import re
import sys

from qwen_tui.cluster.facts import GPU, FileFact, NodeFacts
from qwen_tui.cluster.ib import parse_ibv_devinfo, ports_from_probe
from qwen_tui.nodes.checks.topology import TopologyError, parse_p2p_matrix, parse_topo_matrix, with_p2p
from qwen_tui.nodes.hubmodel import hub_id, synced_rel
from qwen_tui.nodes.programs import program
from qwen_tui.nodes.results import NodeResults, on_nodes
from qwen_tui.nodes.transport.protocol import Transport
from qwen_tui.preset.schema import Preset

GPU_QUERY = ["nvidia-smi", "--query-gpu=index,name,uuid,memory.total,driver_version", "--format=csv"]
VERSIONED = ("qwen-tui", "torch", "transformers", "peft", "deepspeed", "accelerate", "tokenizers", "bitsandbytes",
             "liger-kernel", "nvidia-cudnn-frontend", "torchao")
TOOLS = ("iperf3", "nvidia-smi", "torchrun", "ssh", "ssh-keygen", "ip")

SNIPPET = program("probe.py")  # remote/ib_sysfs.py, digests.py and probe.py


def local_path(spec: str | None) -> str | None:
    """The model's path to check on a node, or None for builtin: specs, hub ids and no spec."""
    if spec is None or spec.startswith(("builtin:", "hf:")):
        return None
    if spec.startswith(("/", ".", "~")):
        return spec
    if re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", spec):
        return None  # a hub id; each node resolves it itself (a relative dir named a/b is ambiguous)
    return spec


def data_path(spec: str | None) -> str | None:
    """A data spec's path to check on a node, or None for builtin: data, hub data sets (hf:ORG/NAME, which
    check --sync fetches) and no spec. Unlike a model, data names the hub only with hf:, so `data/chat.jsonl`
    is the file the worker opens."""
    if spec is None or spec.startswith(("builtin:", "hf:")):
        return None
    return spec


def data_files(preset: Preset) -> dict[str, str]:
    """The run's data files besides training.data, by the field that names them: eval_data, and each source
    of a mixture (its path, or its dataset_info.json)."""
    t = preset.training
    out = {}
    if data_path(t.eval_data):
        out["eval_data"] = str(t.eval_data)
    for k, src in enumerate(t.datasets or []):
        if src.path and data_path(src.path):
            out[f"datasets.{k}.path"] = src.path
        elif src.dataset_info and not src.path:
            out[f"datasets.{k}.dataset_info"] = src.dataset_info
    return out


def dataset_entries(preset: Preset) -> dict[str, str]:
    """dataset_info.json field -> the entry's name: the probe also looks at the file that entry names."""
    return {f"datasets.{k}.dataset_info": str(src.name) for k, src in enumerate(preset.training.datasets or [])
            if src.dataset_info and not src.path}


QUERY_FIELDS = ["index", "name", "uuid", "memory.total", "driver_version"]


def gpu_rows(text: str, fields: list[str] | None = None) -> list[dict[str, str]]:
    """Rows of nvidia-smi --query-gpu CSV as dicts; a header row (with units) names the
    columns, else `fields` does (the order of the --query-gpu list)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    cols = list(fields or QUERY_FIELDS)
    if lines and lines[0].lower().startswith("index"):
        cols = [re.sub(r"\s*\[.*\]$", "", c.strip()) for c in lines[0].split(",")]
        lines = lines[1:]
    rows = []
    for ln in lines:
        vals = dict(zip(cols, (v.strip() for v in ln.split(","))))
        if vals.get("index", "").isdigit():
            rows.append(vals)
    return rows


def parse_gpu_csv(text: str, fields: list[str] | None = None) -> list[GPU]:
    gpus = []
    for vals in gpu_rows(text, fields):
        mem = re.match(r"(\d+)", vals.get("memory.total", ""))
        gpus.append(GPU(index=int(vals["index"]), name=vals.get("name", "?"),
                        memory_total_mib=int(mem.group(1)) if mem else 0, uuid=vals.get("uuid", "")))
    return gpus


def parse_driver(text: str, fields: list[str] | None = None) -> str | None:
    rows = gpu_rows(text, fields)
    return rows[0].get("driver_version") if rows else None


def parse_cuda_from_version(text: str) -> str | None:
    m = re.search(r"CUDA Version\s*:\s*([\d.]+)", text)
    return m.group(1) if m else None


def facts_from_json(d: dict) -> NodeFacts:
    f = NodeFacts(hostname=d.get("hostname"), addresses=d.get("addresses") or {},
                  route_interface=d.get("route_interface"), ib_devices=d.get("ib_devices") or [],
                  cpu_count=d.get("cpu_count"), memory_total_mib=d.get("memory_total_mib"),
                  python_version=d.get("python_version"), versions=d.get("versions") or {},
                  in_container=d.get("in_container"),
                  training_importable=d.get("training_importable"), disk_free_bytes=d.get("disk_free_bytes"),
                  shm_bytes=d.get("shm_bytes"), memlock_bytes=d.get("memlock_bytes"), open_files=d.get("open_files"),
                  cuda_version=d.get("cuda_version"))
    smi = d.get("nvidia_smi")
    if smi is None:
        f.gpus = []  # no nvidia-smi: a CPU-only node (or no driver)
    elif smi["rc"] == 0:
        f.gpus = parse_gpu_csv(smi["out"])
        f.driver_version = parse_driver(smi["out"])
        cuda = parse_cuda_from_version((d.get("nvidia_smi_version") or {}).get("out", ""))
        if cuda:
            f.versions["cuda_driver"] = cuda
        topology_from_json(f, d)
    else:
        f.gpus = None  # nvidia-smi is there but failed: unknown, not absent
        f.error = f"nvidia-smi failed (rc {smi['rc']}): {smi['err'].strip()[-300:]}"
    for k in ("data", "model"):
        if d.get(k):
            setattr(f, k, FileFact(**d[k]))
    f.data_files = {k: FileFact(**v) for k, v in (d.get("data_files") or {}).items() if v}
    ports = d.get("ib_ports") or []
    verbs = d.get("ibv_devinfo") or {}
    if not ports and verbs.get("rc") == 0:  # no HCA in sysfs (a container's /sys?), but the verbs library sees some
        ports = parse_ibv_devinfo(verbs.get("out", ""))
        f.ib_devices = f.ib_devices or sorted({p["hca"] for p in ports})
    f.ib_ports = ports_from_probe(ports)
    f.missing_tools = sorted(t for t, p in (d.get("tools") or {}).items() if not p)
    return f


def topology_from_json(f: NodeFacts, d: dict) -> None:
    """The probe's `nvidia-smi topo` answers into f.topology (or f.topology_error saying why not).
    A driver without `topo -p2p` leaves the pairs' P2P status unknown, which is no error."""
    topo = d.get("topo")
    if topo is None:
        return  # an older probe, or nvidia-smi's GPU query failed first
    if topo["rc"] != 0:
        f.topology_error = f"nvidia-smi topo -m failed (rc {topo['rc']}): {topo['err'].strip()[-200:]}"
        return
    try:
        f.topology = parse_topo_matrix(topo["out"])
    except TopologyError as e:
        f.topology_error = f"nvidia-smi topo -m: {e}"
        return
    maps = {}
    for cap, r in (d.get("p2p") or {}).items():
        if r.get("rc") == 0:
            try:
                maps[cap] = parse_p2p_matrix(r["out"])
            except TopologyError:
                continue  # an unreadable P2P answer leaves that status unknown, the matrix stands
    with_p2p(f.topology, maps.get("r"), maps.get("w"))


def probe_node(t: Transport, preset: Preset, index: int, *, timeout: float = 180.0,
               local_python: str | None = None) -> tuple[NodeFacts, dict]:
    """Probe one node with the interpreter a run would use there (Node.python_for).
    Returns (facts, raw JSON). A missing python is a fact, not a crash."""
    node = preset.cluster.nodes[index]
    python = node.python_for(local_python or sys.executable)  # as replay and the wizard launch it
    prefix: list[str] = []
    if preset.container is not None:  # inside the image the run uses, with its flags and mounts
        from qwen_tui.nodes.checks.containers import probe_prefix

        python = preset.container.python
        prefix = probe_prefix(preset, index, t.abspath(node.workdir))
    tr = preset.training
    args = {"master": preset.master_addr, "tools": list(TOOLS), "gpu_query": GPU_QUERY,
            "versioned": list(VERSIONED), "output_dir": tr.output_dir,
            "data": data_path(tr.data), "model": local_path(tr.model),
            "data_files": data_files(preset), "dataset_entries": dataset_entries(preset),
            "hub_model": [synced_rel(tr.model), tr.model] if hub_id(tr.model) else None,
            "hf_env": {k: v for k, v in preset.network.env.items() if k in ("HF_HOME", "HF_HUB_CACHE")}}
    r = t.run([*prefix, python, "-c", SNIPPET, json.dumps(args)], timeout=timeout, cwd=node.workdir)
    if r.rc == 96:
        host = t.run(["hostname"], timeout=10)
        return NodeFacts(hostname=host.stdout.strip() or None,
                         error=f"workdir {node.workdir} does not exist on the node"), {"workdir_missing": True}
    if prefix and r.rc in (125, 126, 127):  # the runtime's own exit codes: the container did not start
        return NodeFacts(error=f"the container did not start (exit {r.rc})"), \
            {"container_failed": {"rc": r.rc, "err": (r.stderr.strip() or r.stdout.strip())[-2000:]}}
    if r.rc == 127 or (r.rc != 0 and not r.stdout.strip() and "not found" in r.stderr):
        host = t.run(["hostname"], timeout=10)
        return NodeFacts(hostname=host.stdout.strip() or None, missing_tools=["python"],
                         error=f"python {python!r} not found on the node"), {"python_missing": True}
    if r.rc != 0:
        return NodeFacts(error=f"probe failed (rc {r.rc}): {(r.stderr.strip() or r.stdout.strip())[-500:]}"), {}
    try:
        raw = json.loads(r.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return NodeFacts(error=f"probe printed no JSON: {r.stdout[-300:]!r} {r.stderr[-300:]!r}"), {}
    return facts_from_json(raw), raw


def probe_all(preset: Preset, transports: dict[int, Transport], *, timeout: float = 180.0,
              local_python: str | None = None) -> NodeResults:
    """node -> (NodeFacts, raw) in parallel."""
    labels = {i: n.label for i, n in enumerate(preset.cluster.nodes)}
    return on_nodes(lambda i: probe_node(transports[i], preset, i, timeout=timeout, local_python=local_python),
                    sorted(transports),
                    timeout=timeout + 15, labels=labels)
