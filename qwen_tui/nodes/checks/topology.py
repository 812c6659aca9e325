"""A node's GPUs and how they reach each other: `nvidia-smi topo -m` (the link matrix) and `nvidia-smi
topo -p2p r|w` (whether the driver allows peer-to-peer) parsed into a GPUTopology, and what follows from
it: a one-line description, the intra-node bus bandwidth class the estimator can use, and whether the
node's GPUs talk over PCIe in the way NCCL is known to hang on. Pure: no I/O, no torch.

The matrix (`nvidia-smi topo -m`): a header row of device names (GPU0.., then NICs), then "CPU Affinity",
"NUMA Affinity" and, on newer drivers, "GPU NUMA ID"; one row per device with one cell per device (X for
itself, NV<n> for n bonded NVLinks, else the PCIe path: PIX, PXB, PHB, NODE, SYS), then the affinities; a
legend follows. Issue pages and docs keep the tabs or turn them into spaces, so cells are split on any
whitespace (tests/fixtures/nvidia-smi/topo holds real outputs of both kinds).

Bandwidth figures (GB/s, one direction, per GPU; `intra_node_bus` multiplies by 0.8):
- NVLink per link: 25 (NVLink 2 V100, NVLink 3 A100, NVLink 4 H100/H200), 50 (NVLink 5 B200), so 300, 450
  and 900 per GPU with 12, 18 and 18 links (stas00/ml-engineering network/README.md, intra-node table);
  GA102 bridges (RTX 3090, RTX A6000, A40): 14.0625 per link, 4 links (NVIDIA's GA102 whitepaper, quoted in
  huggingface/transformers#9371; `nvidia-smi nvlink -s` prints 14.062 GB/s per link on an A6000,
  siboehm/bench gpu/nvlink/README.md).
- PCIe x16: 31 (Gen4), 63 (Gen5) (ml-engineering's table); Gen3 half of Gen4.
- 0.8: what NCCL's ring reaches of the wire (ml-engineering, "~80% rule": all-reduce busbw 234.89 GB/s on
  8x A100 = 78% of 300, 367.61 GB/s on 8x H200 with NVLS off = 82% of 450).
- Without peer-to-peer NCCL stages every transfer through host memory, crossing PCIe twice: half the PCIe
  figure (an assumption, not a measurement).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qwen_tui.cluster.facts import GPULink, GPUTopology, NodeFacts

if TYPE_CHECKING:
    from qwen_tui.nodes.checks.findings import Finding
    from qwen_tui.preset.schema import Preset

PCIE_PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # best to worst
_LINK = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_CPUS = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
P2P_ENV = ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL")  # either means the user already chose
# GeForce, TITAN and RTX workstation cards: PCIe peer-to-peer is where NCCL hangs until it is turned off
# (DeepSpeed#4433 and nccl-tests#117 on RTX 4090; rtx6kpro#15 on RTX PRO 6000 with the driver saying OK).
CONSUMER = re.compile(r"GeForce|TITAN|\bRTX\b", re.IGNORECASE)
NCCL_EFFICIENCY = 0.8
PCIE_GBS = {3: 15.5, 4: 31.0, 5: 63.0}  # x16, one direction


class TopologyError(ValueError):
    """The text is not an nvidia-smi topology matrix (the message says where)."""


def _split(text: str) -> list[list[str]]:
    rows = []
    for line in _ANSI.sub("", text).splitlines():
        if line.strip().startswith("Legend"):
            break
        if line.strip():
            rows.append(line.split())
    return rows


def parse_topo_matrix(text: str) -> GPUTopology:
    """`nvidia-smi topo -m` -> GPUTopology (GPU pairs, affinities); NICs are left out. Raises
    TopologyError naming the row and column of anything that is not a link code."""
    rows = _split(text)
    head = next((i for i, r in enumerate(rows) if r and r[0] == "GPU0"), None)
    if head is None:
        raise TopologyError("no header row starting with GPU0")
    devices = []
    for tok in rows[head]:
        if tok == "CPU":
            break
        devices.append(tok)
    gpus = [d for d in devices if re.fullmatch(r"GPU\d+", d)]
    if [f"GPU{k}" for k in range(len(gpus))] != gpus:
        raise TopologyError(f"GPU columns are not GPU0..GPU{len(gpus) - 1}: {' '.join(gpus)}")
    cells: dict[int, list[str]] = {}
    cpu: list[str | None] = [None] * len(gpus)
    numa: list[str | None] = [None] * len(gpus)
    for r in rows[head + 1:]:
        if not re.fullmatch(r"GPU\d+", r[0]):
            continue  # NIC rows, and the prompt or notes around the matrix
        g = int(r[0][3:])
        if g >= len(gpus) or len(r) < 1 + len(devices):
            raise TopologyError(f"row {r[0]}: {len(r) - 1} cells for {len(devices)} devices")
        vals = r[1:1 + len(gpus)]
        for col, v in enumerate(vals):
            if not _LINK.match(v):
                raise TopologyError(f"row {r[0]}, column GPU{col}: {v!r} is not a link (X, NV#, PIX, PXB, PHB, "
                                    "NODE, SYS)")
        if vals[g] != "X":
            raise TopologyError(f"row {r[0]}: its own cell is {vals[g]!r}, not X")
        cells[g] = ["SYS" if v == "SOC" else v for v in vals]  # SOC: older drivers' name for SYS
        rest = r[1 + len(devices):]
        if rest and _CPUS.match(rest[0]):
            cpu[g] = rest[0]
            if len(rest) > 1 and _CPUS.match(rest[1]):
                numa[g] = rest[1]
    missing = [f"GPU{k}" for k in range(len(gpus)) if k not in cells]
    if missing:
        raise TopologyError(f"no row for {', '.join(missing)}")
    links = [GPULink(a, b, cells[a][b]) for a in range(len(gpus)) for b in range(a + 1, len(gpus))]
    return GPUTopology(gpus=len(gpus), links=links, cpu_affinity=cpu, numa_affinity=numa)


def parse_p2p_matrix(text: str) -> dict[tuple[int, int], str]:
    """`nvidia-smi topo -p2p r` (or w): (a, b) -> OK, CNS, GNS, TNS, NS, DR or U, for a != b."""
    rows = _split(text)
    head = next((i for i, r in enumerate(rows) if r and r[0] == "GPU0"), None)
    if head is None:
        raise TopologyError("no header row starting with GPU0")
    n = len([t for t in rows[head] if re.fullmatch(r"GPU\d+", t)])
    out: dict[tuple[int, int], str] = {}
    for r in rows[head + 1:]:
        if not re.fullmatch(r"GPU\d+", r[0]):
            continue
        a = int(r[0][3:])
        if len(r) < 1 + n:
            raise TopologyError(f"P2P row {r[0]}: {len(r) - 1} cells for {n} GPUs")
        for b, v in enumerate(r[1:1 + n]):
            if not re.fullmatch(r"[A-Z]+", v):
                raise TopologyError(f"P2P row {r[0]}, column GPU{b}: {v!r} is not a status")
            if a != b:
                out[(a, b)] = v
    return out


def with_p2p(topo: GPUTopology, read: dict | None = None, write: dict | None = None) -> GPUTopology:
    """Sets the driver's P2P status on each pair of `topo` (the worse of a->b and b->a) and returns it."""
    def both(m: dict | None, a: int, b: int) -> str | None:
        if not m:
            return None
        vals = [m.get((a, b)), m.get((b, a))]
        bad = [v for v in vals if v is not None and v != "OK"]
        return bad[0] if bad else next((v for v in vals if v is not None), None)

    for lk in topo.links:
        lk.p2p_read, lk.p2p_write = both(read, lk.a, lk.b), both(write, lk.a, lk.b)
    return topo


# ---------------------------------------------------------------- what the GPUs are

@dataclass(frozen=True)
class _Family:
    nvlink: str  # the NVLink generation, as people name it
    per_link_gbs: float  # one link, one direction
    links: int  # NVLinks per GPU
    pcie: int  # PCIe generation


_FAMILIES = [  # first match wins: the narrower names first
    (re.compile(r"\bG?B[123]00\b"), _Family("NVLink 5", 50.0, 18, 5)),
    (re.compile(r"\bH800\b"), _Family("NVLink 4", 25.0, 8, 5)),
    (re.compile(r"\b(GH200|H100|H200|H20)\b"), _Family("NVLink 4", 25.0, 18, 5)),
    (re.compile(r"\bA800\b"), _Family("NVLink 3", 25.0, 8, 4)),
    (re.compile(r"\bA100\b"), _Family("NVLink 3", 25.0, 12, 4)),
    (re.compile(r"RTX 30[89]0|RTX A[456]\d00|\bA40\b"), _Family("NVLink 3 bridge", 14.0625, 4, 4)),
    (re.compile(r"\bV100\b"), _Family("NVLink 2", 25.0, 6, 3)),
    (re.compile(r"TITAN RTX|Quadro RTX [68]000|RTX 2080 Ti"), _Family("NVLink 2 bridge", 25.0, 2, 3)),
]
_PCIE5 = re.compile(r"RTX 50\d0|Blackwell|RTX PRO", re.IGNORECASE)
_PCIE3 = re.compile(r"\b(P100|P40|P4|T4)\b|RTX 20\d0|GTX|Quadro RTX|TITAN", re.IGNORECASE)


def _family(name: str) -> _Family | None:
    return next((f for rx, f in _FAMILIES if rx.search(name or "")), None)


def _pcie_gen(name: str) -> int:
    fam = _family(name)
    if fam is not None:
        return fam.pcie
    return 5 if _PCIE5.search(name or "") else 3 if _PCIE3.search(name or "") else 4


def is_consumer(name: str) -> bool:
    return bool(CONSUMER.search(name or ""))


# ---------------------------------------------------------------- judging the matrix

def _worst_path(pairs: list[GPULink]) -> str | None:
    paths = [lk.link for lk in pairs if not lk.nvlinks]
    return max(paths, key=PCIE_PATHS.index) if paths else None


def _switched(pairs: list[GPULink], n: int, name: str) -> bool:
    """NVSwitch: every pair has the same NV# and one GPU's pairs add up to more links than it has
    (8x A100 show NV12 to each of 7 peers with 12 links in all); a direct mesh (4x H100 NV6) does not."""
    if n < 3 or not pairs or not all(lk.nvlinks for lk in pairs) or len({lk.nvlinks for lk in pairs}) != 1:
        return False
    fam = _family(name)
    return pairs[0].nvlinks * (n - 1) > (fam.links if fam else 18)


def _p2p_note(pairs: list[GPULink]) -> str:
    states = [lk.p2p_ok for lk in pairs]
    if not pairs or all(s is None for s in states):
        return ""
    bad = sorted({s for lk in pairs for s in (lk.p2p_read, lk.p2p_write) if s not in (None, "OK")})
    return f", no P2P ({'/'.join(bad)})" if bad else ", P2P OK"


def describe(topo: GPUTopology, gpu_name: str = "") -> str:
    """One line for the check: "8 GPUs, NVSwitch (NV18), 2 NUMA nodes", "2 GPUs, PCIe (PHB), no P2P (GNS)".
    P2P is said of the PCIe pairs only (over NVLink it is always there)."""
    n = topo.gpus
    if n < 2:
        return f"{n} GPU"
    pairs = topo.links
    nv = [lk for lk in pairs if lk.nvlinks]
    nvs = "/".join(sorted({lk.link for lk in nv}, key=lambda s: int(s[2:])))
    if _switched(pairs, n, gpu_name):
        text = f"{n} GPUs, NVSwitch ({nvs})"
    elif len(nv) == len(pairs):
        text = f"{n} GPUs, NVLink ({nvs})" if n == 2 else f"{n} GPUs, NVLink mesh ({nvs})"
    elif nv:
        text = f"{n} GPUs, NVLink between {len(nv)} of {len(pairs)} pairs ({nvs}), the rest PCIe ({_worst_path(pairs)})"
    else:
        text = f"{n} GPUs, PCIe ({_worst_path(pairs)})"
    text += _p2p_note([lk for lk in pairs if not lk.nvlinks])
    numa = {x for x in topo.numa_affinity if x is not None}
    return text + (f", {len(numa)} NUMA nodes" if len(numa) > 1 else "")


@dataclass(frozen=True)
class IntraNodeBus:
    """The bandwidth class of one node's GPU interconnect, for the step-time estimate."""

    kind: str  # "nvswitch" | "nvlink" | "pcie"
    gbs: float  # NCCL bus bandwidth inside the node, GB/s (the unit of estimate.GPUSpec.intra_node_gbs)
    label: str  # "NVSwitch, NVLink 4, 18 links"
    basis: str  # how the figure was reached


def intra_node_bus(topo: GPUTopology, gpu_name: str = "", gpus: int | None = None) -> IntraNodeBus | None:
    """The bus a ring over the node's first `gpus` GPUs (all when None) runs at; None below two GPUs.

    Every pair on NVLink: the GPU's NVLinks (capped at what its family has: an NVSwitch shows all of them
    to every peer) x the per-link rate x 0.8. Any pair on PCIe: the ring crosses PCIe, so the PCIe x16 rate
    of the GPU's generation x 0.8, halved when the traffic goes through host memory (the driver reports no
    P2P, or consumer cards, on which NCCL_P2P_LEVEL=NVL is the advice). Figures: the module docstring."""
    n = topo.gpus if gpus is None else min(gpus, topo.gpus)
    if n < 2:
        return None
    pairs = topo.among(n)
    fam = _family(gpu_name)
    if all(lk.nvlinks for lk in pairs):
        ends = min(sum(lk.nvlinks for lk in pairs if g in (lk.a, lk.b)) for g in range(n))
        switched = _switched(pairs, n, gpu_name)
        if fam:
            links = min(ends, fam.links)
        else:  # unknown GPU: behind a switch every peer shows all of its links; in a mesh they add up
            links = pairs[0].nvlinks if switched else ends
        rate = fam.per_link_gbs if fam else 25.0
        what = ["NVSwitch" if switched else "NVLink"] + ([fam.nvlink] if fam else []) + [f"{links} links"]
        return IntraNodeBus("nvswitch" if switched else "nvlink", round(links * rate * NCCL_EFFICIENCY, 1),
                            ", ".join(what),
                            f"{links} links x {rate:g} GB/s x {NCCL_EFFICIENCY}"
                            + ("" if fam else " (GPU not known: 25 GB/s per link assumed)"))
    gen = _pcie_gen(gpu_name)
    host = is_consumer(gpu_name) or any(lk.p2p_ok is False for lk in pairs if not lk.nvlinks)
    gbs = PCIE_GBS[gen] * NCCL_EFFICIENCY * (0.5 if host else 1.0)
    partly = " (NVLink between some pairs)" if any(lk.nvlinks for lk in pairs) else ""
    return IntraNodeBus("pcie", round(gbs, 1), f"PCIe Gen{gen}{', through host memory' if host else ''}{partly}",
                        f"PCIe Gen{gen} x16 {PCIE_GBS[gen]:g} GB/s x {NCCL_EFFICIENCY}" + (" / 2" if host else ""))


def node_intra_bus(facts: NodeFacts | None, gpus: int | None = None) -> IntraNodeBus | None:
    """intra_node_bus for one node's probe facts; None without a matrix or below two GPUs."""
    if facts is None or facts.topology is None:
        return None
    return intra_node_bus(facts.topology, facts.gpu_model or "", gpus)


@dataclass(frozen=True)
class P2PRisk:
    """PCIe-only GPU pairs a run uses, that NCCL may hang on (consumer) or crosses without P2P (others)."""

    pairs: tuple[GPULink, ...]
    consumer: bool

    def where(self) -> str:
        shown = [f"GPU{lk.a}-GPU{lk.b} {lk.link}" + (f" (P2P {lk.p2p_read or lk.p2p_write})"
                                                     if lk.p2p_ok is not None else "") for lk in self.pairs[:3]]
        return ", ".join(shown) + (f" and {len(self.pairs) - 3} more" if len(self.pairs) > 3 else "")


def p2p_risk(topo: GPUTopology, gpu_name: str = "", gpus: int | None = None) -> P2PRisk | None:
    """Consumer or workstation cards (GeForce, TITAN, RTX) joined over PCIe only: whatever the driver says,
    this is where NCCL hangs until P2P is turned off. Other GPUs: only the pairs the driver reports without
    P2P (NCCL then goes through host memory: slower, no hang). None when nothing applies."""
    pcie = [lk for lk in topo.among(gpus) if not lk.nvlinks]
    if not pcie:
        return None
    if is_consumer(gpu_name):
        return P2PRisk(tuple(pcie), True)
    bad = [lk for lk in pcie if lk.p2p_ok is False]
    return P2PRisk(tuple(bad), False) if bad else None


def p2p_message(label: str, n: int, gpu_name: str, risk: P2PRisk) -> str:
    if risk.consumer:
        return (f"{label}: {n} x {gpu_name} talk over PCIe ({risk.where()}); on GeForce/RTX cards NCCL's PCIe "
                "peer-to-peer hangs the first collective (DeepSpeed#4433, nccl-tests#117), the driver's OK "
                "notwithstanding")
    return (f"{label}: the driver reports no peer-to-peer between {risk.where()}: NCCL goes through host "
            "memory there (slower, not a hang)")


P2P_FIX_LABEL = "NCCL_P2P_LEVEL=NVL: peer-to-peer over NVLink only"


def p2p_env(env: dict[str, str]) -> dict[str, str]:
    """network.env with P2P over NVLink only. NCCL_P2P_LEVEL=NVL rather than NCCL_P2P_DISABLE=1:
    network.env reaches every node, and NVL keeps NVLink bridges and NVSwitch nodes on P2P while PCIe
    pairs go through host memory; DISABLE would drop NVLink too."""
    return {**env, "NCCL_P2P_LEVEL": "NVL"}


def topology_findings(preset: "Preset", i: int, label: str, f: NodeFacts) -> "list[Finding]":
    """The check matrix's word on node i's GPU topology (column "gpu"): the matrix in one line, and the
    P2P_PCIE warning (the advice rule of the same code carries the one-key fix) or P2P_UNSUPPORTED note."""
    from qwen_tui.nodes.checks.findings import INFO, WARNING, Finding

    out = []
    if f.topology_error:
        out.append(Finding(INFO, "GPU_TOPOLOGY", f"{label}: GPU topology not read ({f.topology_error})", "", i, "gpu"))
    if f.topology is None:
        return out
    name = f.gpu_model or ""
    line = f"{label}: {describe(f.topology, name)}"
    bus = intra_node_bus(f.topology, name, preset.cluster.nodes[i].gpus)
    if bus is not None:
        line += f"; bus ~{bus.gbs:g} GB/s ({bus.label})"
    out.append(Finding(INFO, "GPU_TOPOLOGY", line, "", i, "gpu"))
    env = preset.network.env
    ranks = preset.cluster.nodes[i].gpus
    if (ranks < 2 or preset.training.device == "cpu" or preset.network.backend == "gloo"
            or any(k in env for k in P2P_ENV)):
        return out
    risk = p2p_risk(f.topology, name, ranks)
    if risk is not None:
        msg = p2p_message(label, min(ranks, f.topology.gpus), name or "GPU", risk)
        if risk.consumer:
            out.append(Finding(WARNING, "P2P_PCIE", msg, "set network.env NCCL_P2P_LEVEL: NVL (P2P over NVLink "
                               "only; the wizard's F8 applies it)", i, "gpu"))
        else:
            out.append(Finding(INFO, "P2P_UNSUPPORTED", msg, "", i, "gpu"))
    return out
