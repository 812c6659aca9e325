"""Findings about InfiniBand/RoCE: the HCA ports the probe found on a node, and
the network NCCL chose in the rehearsal. A node with HCAs whose NCCL fell back
to sockets trains at a fraction of the fabric's speed and says so nowhere but
in its INFO lines: that is a warning naming the node."""

from __future__ import annotations

from qwen_tui.cluster.facts import ClusterFacts, NodeFacts
from qwen_tui.cluster.ib import active_ports, describe
from qwen_tui.nodes.checks.findings import INFO, WARNING, Finding

PORTS_FIX = ("bring the port up (ibstat / ibv_devinfo show its state; check the cable and the subnet manager, "
             "opensm), or set network.nccl_ib_disable: true to use sockets on purpose")
FALLBACK_FIX = ("look for 'NET/IB' in the rehearsal log on that node: the HCA must be visible to the job "
                "(in a container: --device=/dev/infiniband --cap-add=IPC_LOCK, --ulimit memlock=-1), its port "
                "ACTIVE, NCCL_IB_HCA must name it and, on RoCE, NCCL_IB_GID_INDEX must be a RoCE v2 GID; "
                "or set network.nccl_ib_disable: true if sockets are what you want")


def ib_findings(i: int, lab: str, f: NodeFacts, column: str = "bandwidth") -> list[Finding]:
    """A node's HCA ports: listed (info), or a warning when it has HCAs and no port is up."""
    if not f.ib_ports:
        return []
    if not active_ports(f.ib_ports):
        return [Finding(WARNING, "IB_PORTS_DOWN", f"{lab}: InfiniBand/RoCE HCAs but no active port "
                        f"({describe(f.ib_ports)}); NCCL will use sockets", PORTS_FIX, i, column)]
    return [Finding(INFO, "IB_PORTS", f"{lab}: {describe(f.ib_ports)}", "", i, column)]


def nccl_network_findings(labels: list[str], facts: ClusterFacts | None,
                          transports: dict[int, str | None]) -> list[Finding]:
    """Per node, what NCCL chose in the rehearsal; sockets on a node with HCAs is a warning."""
    out = []
    for i, net in sorted(transports.items()):
        nf = facts.nodes.get(i) if facts is not None else None
        has_hca = nf is not None and bool(active_ports(nf.ib_ports) or (not nf.ib_ports and nf.ib_devices))
        if net == "Socket" and has_hca:
            assert nf is not None
            what = describe(nf.ib_ports) if nf.ib_ports else ", ".join(nf.ib_devices)
            out.append(Finding(WARNING, "NCCL_SOCKET_FALLBACK",
                               f"{labels[i]}: NCCL fell back to sockets (NET/Socket) between nodes though the node "
                               f"has HCAs ({what})", FALLBACK_FIX, i, "rehearsal"))
        elif net is None:
            out.append(Finding(INFO, "NCCL_NETWORK", f"{labels[i]}: NCCL named no network in its log "
                               "(NCCL_DEBUG=INFO lines missing)", "", i, "rehearsal"))
        else:
            out.append(Finding(INFO, "NCCL_NETWORK", f"{labels[i]}: NCCL used NET/{net} between nodes", "", i,
                               "rehearsal"))
    return out
