"""All node checks in one pass: connect, probe, consistency, ports, firewall,
bandwidth. Fills ClusterFacts faithfully (the planner and the advice rules read
it) and returns findings, each placed in the node x check matrix."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qwen_tui.base.levels import worst
from qwen_tui.cluster.facts import ClusterFacts, LinkFacts, NodeFacts, file_fact
from qwen_tui.nodes.checks.containers import HOST_TOOLS, image_findings
from qwen_tui.nodes.checks.containers import precheck as container_precheck
from qwen_tui.nodes.checks.containers import start_failure as container_start_failure
from qwen_tui.nodes.checks.findings import ERROR, INFO, WARNING, Finding, connect_fix
from qwen_tui.nodes.checks.ibcheck import ib_findings
from qwen_tui.nodes.checks.netcheck import check_bandwidth, check_firewalls, check_ports
from qwen_tui.nodes.checks.probe import probe_all
from qwen_tui.nodes.checks.topology import topology_findings
from qwen_tui.nodes.transport.protocol import Transport
from qwen_tui.preset.schema import Preset

COLUMNS = ["ssh", "container", "python", "gpu", "code", "data", "model", "disk", "limits", "port", "nccl-ports",
           "firewall", "bandwidth", "rehearsal"]
FIXES = {
    "python": "install Python 3.10+ on the node, or set cluster.nodes[{i}].python to its path",
    "torchrun": "{py} -m pip install torch  (torchrun comes with torch)",
    "iperf3": "apt-get install iperf3  (or dnf install iperf3)",
    "nvidia-smi": "install the NVIDIA driver (apt-get install nvidia-driver-XXX), or set training.device: cpu",
}
LOW_DISK = 20 << 30
MIN_SHM = 1 << 30  # Docker's default /dev/shm is 64 MB: NCCL's shared-memory transport and DataLoader workers fail
MIN_OPEN_FILES = 4096


def limit_findings(i: int, lab: str, f: NodeFacts, pins_memory: bool = True) -> list[Finding]:
    """/dev/shm size, memlock and open-file limits, as a job started over SSH gets them. `pins_memory`: false for
    a CPU run over gloo, which pins nothing, so memlock does not matter there."""
    out = []
    # pinned memory and RDMA need memlock; on a CPU-only node it is only worth a note
    lvl = WARNING if f.gpus or f.ib_devices else INFO
    if f.shm_bytes is not None and f.shm_bytes < MIN_SHM:
        out.append(Finding(WARNING, "SHM_SMALL", f"{lab}: /dev/shm is {f.shm_bytes / 2**20:.0f} MiB; NCCL's "
                           "shared memory and DataLoader workers need at least 1 GiB",
                           "in a container: docker run --shm-size=16g (or --ipc=host); on a host: "
                           "mount -o remount,size=16G /dev/shm", i, "limits"))
    if pins_memory and f.memlock_bytes is not None and f.memlock_bytes != -1:
        out.append(Finding(lvl, "MEMLOCK_LIMITED", f"{lab}: locked memory is limited to "
                           f"{f.memlock_bytes / 2**20:.0f} MiB (ulimit -l); NCCL pins memory for GPU and RDMA transfers",
                           "ulimit -l unlimited (/etc/security/limits.conf: * - memlock unlimited; "
                           "docker run --ulimit memlock=-1)", i, "limits"))
    if f.open_files is not None and f.open_files != -1 and f.open_files < MIN_OPEN_FILES:
        out.append(Finding(lvl, "OPEN_FILES_LOW", f"{lab}: at most {f.open_files} open files (ulimit -n); "
                           "DataLoader workers and NCCL's sockets take many",
                           "ulimit -n 65536 (/etc/security/limits.conf: * - nofile 65536)", i, "limits"))
    return out


@dataclass
class CheckReport:
    facts: ClusterFacts
    findings: list[Finding] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]

    @property
    def ok(self) -> bool:
        return not self.errors

    def cell(self, node: int, column: str) -> tuple[str | None, list[Finding]]:
        """(verdict, findings) for one matrix cell: ok / info / warning / error / None (not checked)."""
        fs = [f for f in self.findings if f.node == node and f.check == column]
        lv = worst(f.level for f in fs)
        return lv, fs

    def to_dict(self) -> dict[str, Any]:
        matrix = {}
        for i, lab in enumerate(self.labels):
            matrix[lab] = {c: self.verdict(i, c) for c in COLUMNS}
        why = {}
        for (i, c), reason in sorted(self.not_checked.items()):
            why.setdefault(self.labels[i], {})[c] = reason
        return {"ok": self.ok, "seconds": round(self.seconds, 2), "labels": self.labels, "matrix": matrix,
                "not_checked": why,
                "findings": [f.to_dict() for f in self.findings], "facts": self.facts.to_dict()}

    def verdict(self, i: int, column: str) -> str:
        """ok / warning / error; "not checked" when the check could not run (not_checked says
        why); "-" when it does not apply (a data file on the hub, one node's ports)."""
        lv, _ = self.cell(i, column)
        if (i, column) in self.not_checked and lv != ERROR:
            return "not checked"  # what was not looked at is never "ok", whatever else was said about it
        if lv is None:
            return "ok" if column in self._checked.get(i, set()) else "-"
        return "ok" if lv == INFO else lv.value

    _checked: dict = field(default_factory=dict)
    not_checked: dict = field(default_factory=dict)  # (node, column) -> why the check could not run


def consistency(preset: Preset, facts: ClusterFacts, *, probed: set | None = None,
                local_python: str | None = None) -> list[Finding]:
    """Compare nodes with each other and with the preset (pure). Only `probed` nodes (all
    nodes with facts, when not given) are judged: an unreachable node has no stack to judge."""
    out: list[Finding] = []
    nodes = preset.cluster.nodes
    local_python = local_python or sys.executable
    node_facts = {i: f for i, f in facts.nodes.items() if probed is None or i in probed}
    ok = {i: f for i, f in node_facts.items() if f.error is None or f.gpus is None and "nvidia" in (f.error or "")}
    ref_i = 0 if 0 in ok else (min(ok) if ok else None)
    want_gpu = preset.training.device != "cpu"
    for i, f in sorted(node_facts.items()):
        lab, py = nodes[i].label, nodes[i].python_for(local_python)
        if "python" in f.missing_tools:
            out.append(Finding(ERROR, "PYTHON_MISSING", f"{lab}: {f.error}", FIXES["python"].format(i=i), i, "python"))
            continue
        if f.error and "workdir" in f.error:
            out.append(Finding(ERROR, "WORKDIR_MISSING", f"{lab}: {f.error}",
                               "create it, or sync the code (qwen-tui check --sync)", i, "code"))
            continue
        if f.error and f.gpus is not None:
            out.append(Finding(ERROR, "PROBE_FAILED", f"{lab}: {f.error}", "", i, "python"))
            continue
        if preset.container is not None:  # the image's Python: what it lacks is the image's to fix
            out += image_findings(preset, i, f)
        elif f.versions.get("torch") is None:
            out.append(Finding(ERROR, "TORCH_MISSING", f"{lab}: torch is not installed for {py}",
                               FIXES["torchrun"].format(py=py), i, "python"))
        elif "torchrun" in f.missing_tools:
            out.append(Finding(WARNING, "TORCHRUN_MISSING", f"{lab}: no torchrun next to {py} "
                               "(qwen-tui runs `python -m torch.distributed.run`, which is enough)", "", i, "python"))
        # GPUs
        if f.gpus is None:
            out.append(Finding(ERROR if want_gpu else WARNING, "GPU_QUERY_FAILED", f"{lab}: {f.error}",
                               "check the driver with nvidia-smi on the node", i, "gpu"))
        elif not f.gpus:
            lvl = ERROR if preset.training.device == "cuda" else (WARNING if want_gpu else INFO)
            msg = f"{lab}: CPU-only (no nvidia-smi)" + ("" if not want_gpu else "; training wants GPUs")
            out.append(Finding(lvl, "CPU_ONLY", msg, FIXES["nvidia-smi"] if want_gpu else "", i, "gpu"))
        else:
            desc = f"{lab}: {len(f.gpus)} x {f.gpu_model} ({f.gpu_memory_gib:.0f} GiB), driver {f.driver_version}"
            if len(f.gpus) < nodes[i].gpus:
                out.append(Finding(ERROR, "TOO_FEW_GPUS", desc + f"; the preset asks for {nodes[i].gpus}",
                                   f"set cluster.nodes[{i}].gpus: {len(f.gpus)}", i, "gpu"))
            else:
                out.append(Finding(INFO, "GPUS", desc, "", i, "gpu"))
            out += topology_findings(preset, i, lab, f)
        if not f.training_importable and preset.container is None:
            out.append(Finding(ERROR, "CODE_MISSING", f"{lab}: `training` is not importable in {nodes[i].workdir}",
                               "copy the project there: qwen-tui check --sync", i, "code"))
        if f.disk_free_bytes is not None and f.disk_free_bytes < LOW_DISK:
            out.append(Finding(WARNING, "LOW_DISK", f"{lab}: {f.disk_free_bytes / 2**30:.1f} GiB free for "
                               f"{preset.training.output_dir}", "free space or point training.output_dir elsewhere",
                               i, "disk"))
        out += limit_findings(i, lab, f, pins_memory=want_gpu and preset.network.backend != "gloo")
        out += ib_findings(i, lab, f)
        if "iperf3" in f.missing_tools:
            out.append(Finding(WARNING, "IPERF3_MISSING", f"{lab}: iperf3 is not installed", FIXES["iperf3"],
                               i, "bandwidth"))
    if ref_i is None:
        return out
    ref = facts.nodes[ref_i]
    for i, f in sorted(ok.items()):
        if i == ref_i:
            continue
        lab = nodes[i].label
        for pkg in ("torch", "transformers", "peft", "deepspeed", "accelerate"):
            a, b = ref.versions.get(pkg), f.versions.get(pkg)
            if a != b and (a or b):
                lvl = ERROR if pkg == "torch" else WARNING
                fix = f"{nodes[i].python_for(local_python)} -m pip install {pkg}=={a}" if a else ""
                if preset.container is not None:
                    fix = f"the nodes hold different builds of {preset.container.image}: copy the master's there"
                out.append(Finding(lvl, "VERSION_MISMATCH", f"{lab}: {pkg} {b or 'missing'}, master has {a or 'missing'}",
                                   fix, i, "python"))
        if ref.python_version and f.python_version and ref.python_version.rsplit(".", 1)[0] != \
                f.python_version.rsplit(".", 1)[0]:
            out.append(Finding(WARNING, "PYTHON_MISMATCH", f"{lab}: Python {f.python_version}, master has "
                               f"{ref.python_version}", "", i, "python"))
        if ref.gpus and f.gpus and ref.gpu_model != f.gpu_model:
            out.append(Finding(WARNING, "GPU_MODEL_MISMATCH", f"{lab}: {f.gpu_model}, master has {ref.gpu_model}; "
                               "the slowest GPU sets the pace", "", i, "gpu"))
        if ref.gpus is not None and f.gpus is not None and len(ref.gpus) != len(f.gpus):
            out.append(Finding(WARNING, "GPU_COUNT_MISMATCH", f"{lab}: {len(f.gpus)} GPUs, master has {len(ref.gpus)}",
                               "", i, "gpu"))
    ref_facts = node_facts.get(ref_i) if ref_i is not None else None
    extra = sorted({k for f in node_facts.values() for k in f.data_files})
    for kind in ("data", "model", *extra):
        r = file_fact(ref_facts, kind)
        column = "model" if kind == "model" else "data"
        said = kind if kind in ("data", "model") else f"training.{kind}"  # eval_data, datasets.K.path, ...
        for i, f in sorted(node_facts.items()):
            x = file_fact(f, kind)
            if x is None or f.error and "python" in f.missing_tools:
                continue
            lab = nodes[i].label
            if not x.exists:
                on_master = r is not None and r.exists and i != ref_i
                out.append(Finding(ERROR, "MODEL_MISSING" if kind == "model" else "DATA_MISSING",
                                   f"{lab}: {said} {x.path} is missing",
                                   "copy it from the master: qwen-tui check --sync" if on_master else
                                   f"the master lacks it too: put it at {x.path} on node {ref_i}, or correct "
                                   f"training.{kind} in the preset", i, column))
            elif r is not None and r.exists and i != ref_i and x.sha256 != r.sha256:
                out.append(Finding(ERROR, "MODEL_DIFFERS" if kind == "model" else "DATA_DIFFERS",
                                   f"{lab}: {said} {x.path} differs from the master's "
                                   f"({x.size_bytes} vs {r.size_bytes} bytes, sha256 {x.sha256[:12]} vs {r.sha256[:12]})",
                                   "qwen-tui check --sync --overwrite replaces it with the master's copy", i, column))
    return out


def output_findings(preset: Preset, facts: ClusterFacts, probed: set) -> list[Finding]:
    """Per node: where the checkpoints and the final model will live, and whether the node has room for them."""
    from ...model.spec import UnknownModel, resolve_model
    from ...plan import outputs

    try:
        spec = resolve_model(preset.training.model)
    except (UnknownModel, ValueError):
        spec = None  # a hub id qwen-tui does not know: the places are still shown, the room is not judged
    out = []
    for i, label, where in outputs.places(preset):
        f = facts.nodes.get(i)
        if i not in probed or f is None:
            continue
        problem = outputs.room_problem(preset, spec, i, f.disk_free_bytes)
        if problem:
            out.append(Finding(ERROR, "OUTPUT_NO_ROOM", problem, "free space, lower training.save_total_limit, or "
                               "point training.output_dir at a larger disk", i, "disk"))
        else:
            room = ""
            if spec is not None and f.disk_free_bytes is not None:
                need = outputs.output_need(preset, spec, i)
                room = f"; ~{outputs.gib(need.total_bytes)} needed, {outputs.gib(f.disk_free_bytes)} free"
            out.append(Finding(INFO, "OUTPUT_PLACE", f"{label}: checkpoints and final model in {where}{room}",
                               "", i, "disk"))
    return out


Progress = Callable[[str, int | None, str], None]  # (check, node or None for all, what happened)


def run_checks(preset: Preset, transports: dict[int, Transport], *, connect_errors: dict | None = None,
               network: bool = True, bandwidth_seconds: float = 2.0,
               warn_below_gbps: float = 10.0, local_python: str | None = None,
               progress: Progress | None = None) -> CheckReport:
    """`local_python`: what local nodes without a python of their own run (as make_plan);
    qwen-tui's own interpreter by default, as `replay` and the wizard launch them.
    `progress` hears each check start (node None) and each node's outcome, as they come."""
    local_python = local_python or sys.executable
    say: Progress = progress or (lambda check, node, text: None)
    t0 = time.monotonic()
    nodes = preset.cluster.nodes
    facts = ClusterFacts()
    rep = CheckReport(facts, labels=[n.label for n in nodes])
    checked: dict[int, set] = {i: set() for i in range(len(nodes))}
    for i, e in (connect_errors or {}).items():
        facts.nodes[i] = NodeFacts(error=str(e))
        rep.findings.append(Finding(ERROR, "UNREACHABLE", str(e), connect_fix(e), i, "ssh"))
        for c in COLUMNS[1:]:
            rep.not_checked[(i, c)] = "the node is unreachable"
    for i in transports:
        checked[i].add("ssh")
    blocked: set[int] = set()
    if preset.container is not None:
        c = preset.container
        say("container", None, f"looking for {c.runtime} and the image {c.image} on {len(transports)} node(s)")
        found, blocked, host_missing = container_precheck(preset, transports)
        rep.findings += found
        for i in transports:
            checked[i].add("container")
            say("container", i, "cannot run the job's container" if i in blocked else f"{c.runtime} and the image")
        for i in blocked:  # nothing can be probed where the image cannot run
            facts.nodes[i] = NodeFacts(error=f"no {c.runtime} or no image {c.image}", missing_tools=["python"])
            for col in COLUMNS[2:]:
                rep.not_checked[(i, col)] = f"the job's container cannot run there ({c.runtime}, {c.image})"
    where = " inside the image" if preset.container is not None else ""
    say("probe", None, f"probing {len(transports) - len(blocked)} node(s){where}: Python stack, GPUs, data, disk")
    probes = probe_all(preset, {i: t for i, t in transports.items() if i not in blocked}, local_python=local_python)
    for i, v in sorted(probes.items()):
        say("probe", i, f"probe failed: {v}" if isinstance(v, BaseException) else "probed")
    probed: set[int] = set()
    ephemeral = {}
    for i, v in probes.items():
        if isinstance(v, BaseException):
            facts.nodes[i] = NodeFacts(error=f"probe: {v}")
            rep.findings.append(Finding(ERROR, "PROBE_FAILED", f"{nodes[i].label}: {v}", "", i, "python"))
            for c in ("gpu", "code", "data", "model", "disk", "limits"):
                rep.not_checked[(i, c)] = "the probe failed"
            continue
        facts.nodes[i], raw = v
        if preset.container is not None:  # the probe saw the image's tools; these few run on the node itself
            f = facts.nodes[i]
            f.missing_tools = sorted({t for t in f.missing_tools if t not in HOST_TOOLS} |
                                     set(host_missing.get(i, [])))
        if raw.get("container_failed"):
            rep.findings.append(container_start_failure(preset, i, raw["container_failed"]["rc"],
                                                        raw["container_failed"]["err"]))
            facts.nodes[i].missing_tools = ["python"]  # no Python to run the node's programs in
            for col in COLUMNS[2:]:
                rep.not_checked[(i, col)] = "the job's container did not start there"
            continue
        probed.add(i)
        if raw.get("ephemeral_ports"):
            ephemeral[i] = tuple(raw["ephemeral_ports"])
        if raw.get("python_missing") or raw.get("workdir_missing"):
            # nothing past the python check ran on this node: no ok for what was not looked at
            why = "no python to probe with" if raw.get("python_missing") else "the workdir is missing"
            checked[i].add("python" if raw.get("python_missing") else "code")
            for c in ("gpu", "code", "data", "model", "disk", "limits"):
                if c not in checked[i]:
                    rep.not_checked[(i, c)] = why
            continue
        checked[i] |= {"python", "gpu", "code", "disk"} | ({"limits"} if raw.get("shm_bytes") is not None else set())
        if raw.get("data") is not None or any(raw.get("data_files") or {}):
            checked[i].add("data")
        if raw.get("model") is not None:
            checked[i].add("model")
    rep.findings += consistency(preset, facts, probed=probed, local_python=local_python)
    rep.findings += output_findings(preset, facts, probed)
    if len(transports) > 1:
        from .storage import detect_shared_storage

        say("storage", None, "looking for storage the nodes share")
        facts.shared_storage = detect_shared_storage(preset, transports)
    alive = {i: t for i, t in transports.items()
             if i in facts.nodes and "python" not in facts.nodes[i].missing_tools}
    if network and len(nodes) > 1 and 0 in alive:
        say("port", None, f"master port {preset.network.master_port}: can every node reach node 0?")
        rep.findings += check_ports(preset, alive, facts, ephemeral=ephemeral)
        if facts.master_port_free is not None:
            say("port", 0, "the master port is free" if facts.master_port_free else "the master port is in use")
        for i, lk in sorted(facts.links.items()):
            if i:
                say("port", i, "reaches the master port" if lk.port_reachable else
                    f"cannot reach the master port: {lk.port_error or 'blocked'}")
        say("firewall", None, "reading every node's firewall rules")
        rep.findings += check_firewalls(preset, transports, facts)
        say("bandwidth", None, f"iperf3 from each node to node 0 ({bandwidth_seconds:g} s each)")
        rep.findings += check_bandwidth(preset, alive, facts, seconds=bandwidth_seconds,
                                        warn_below_gbps=warn_below_gbps)
        for i, lk in sorted(facts.links.items()):
            if i:
                say("bandwidth", i, f"{lk.bandwidth_gbps:.1f} Gbit/s" if lk.bandwidth_gbps is not None
                    else f"not measured: {lk.bandwidth_error or 'no result'}")
        for i in alive:
            checked[i] |= {"port", "nccl-ports", "firewall"} | ({"bandwidth"} if i else set())
        for i, lk in facts.links.items():
            if lk.firewall_unread:  # rules nobody could read are no evidence of an open path
                rep.not_checked[(i, "firewall")] = lk.firewall_unread
    rep._checked = checked
    rep.seconds = time.monotonic() - t0
    return rep


# The network checks that can be run again on their own: name -> the matrix
# columns (Finding.check) its findings land in.
NETWORK_CHECKS: dict[str, tuple[str, ...]] = {
    "port": ("port", "nccl-ports"),
    "firewall": ("firewall",),
    "bandwidth": ("bandwidth",),
}


def replace_findings(old: list[Finding], new: list[Finding], which: str) -> list[Finding]:
    """The findings after network check `which` ran again: its columns' old findings go, its new ones come."""
    cols = set(NETWORK_CHECKS.get(which, ())) | {f.check for f in new if f.check}
    return [f for f in old if f.check not in cols] + list(new)


def run_network_check(preset: Preset, transports: dict[int, Transport], which: str, facts: ClusterFacts, *,
                      bandwidth_seconds: float = 2.0, warn_below_gbps: float = 10.0
                      ) -> tuple[ClusterFacts, list[Finding]]:
    """Run ONE network check (a key of NETWORK_CHECKS) again, the same function
    run_checks calls. `facts` is what is already known; it is not changed. Returns a
    copy with this check's fields measured afresh (the other checks' fields as they
    were) and this check's findings (they replace the findings in its columns).
    Nodes without probe facts (no addresses known) are probed first."""
    if which not in NETWORK_CHECKS:
        raise ValueError(f"unknown network check {which!r} (one of {', '.join(NETWORK_CHECKS)})")
    out = ClusterFacts.from_dict(facts.to_dict())
    findings: list[Finding] = []
    nodes = preset.cluster.nodes
    ephemeral: dict[int, tuple[int, int]] = {}
    unprobed = {i: t for i, t in transports.items() if i not in out.nodes or not out.nodes[i].addresses}
    if unprobed and which != "firewall":
        for i, v in probe_all(preset, unprobed).items():
            if isinstance(v, BaseException):
                out.nodes[i] = NodeFacts(error=f"probe: {v}")
                findings.append(Finding(ERROR, "PROBE_FAILED", f"{nodes[i].label}: {v}", "", i, "python"))
                continue
            out.nodes[i], raw = v
            if raw.get("ephemeral_ports"):
                ephemeral[i] = tuple(raw["ephemeral_ports"])
    if len(nodes) < 2:
        return out, findings
    alive = {i: t for i, t in transports.items()
             if i in out.nodes and "python" not in out.nodes[i].missing_tools}
    for i in transports:  # forget what this check measured before
        lk = out.links.setdefault(i, LinkFacts())
        if which == "port":
            lk.port_reachable = lk.port_error = None
        elif which == "bandwidth":
            lk.bandwidth_gbps = lk.bandwidth_error = None
        else:
            lk.firewall, lk.firewall_unread = [], None
    if which == "port":
        out.master_port_free = None
        if 0 not in alive:
            findings.append(Finding(ERROR, "PORT_TEST_FAILED", f"the master ({nodes[0].label}) cannot run the "
                                    "port test (not connected, or no Python there)", "", 0, "port"))
        else:
            findings += check_ports(preset, alive, out, ephemeral=ephemeral)
    elif which == "bandwidth":
        if 0 not in alive:
            findings.append(Finding(WARNING, "BANDWIDTH_UNMEASURED", f"the master ({nodes[0].label}) is not "
                                    "connected: no bandwidth measured", "", 0, "bandwidth"))
        else:
            findings += check_bandwidth(preset, alive, out, seconds=bandwidth_seconds,
                                        warn_below_gbps=warn_below_gbps)
    else:
        findings += check_firewalls(preset, transports, out)
    return out, findings
