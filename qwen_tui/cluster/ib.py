"""InfiniBand and RoCE: what a node's HCAs are, what NCCL should be told about
them, and what NCCL said it used.

- The probe reads the HCA ports from sysfs on the node (qwen_tui/nodes/remote/ib_sysfs.py).
  `parse_ibv_devinfo` reads `ibv_devinfo -v`, used where sysfs shows no HCA but
  the verbs tool does.
- `ports_from_probe` turns either into IBPort facts, with the GID index NCCL
  should use on a RoCE port: RoCE v2 with an IPv4-mapped address first (what
  routed RoCE fabrics need; NCCL before 2.21 defaults to index 0, a RoCE v1
  link-local GID), then any RoCE v2, then the first GID.
- `nccl_ib_env` gives NCCL_IB_HCA (exact names, active ports only) and
  NCCL_IB_GID_INDEX for a node.
- `nccl_transport` reads a node's NCCL_DEBUG=INFO lines: "via NET/IB/0",
  "Using network IB" -> "IB"; "via NET/Socket/0", "Using network Socket" ->
  "Socket". A "NET/Socket : Using" line alone proves nothing: NCCL prints it
  while it sets up every transport.
Pure functions, no I/O.
"""

from __future__ import annotations

import re

from qwen_tui.cluster.facts import IBPort

_STATE = re.compile(r"^\s*(?:\d+:\s*)?(?:PORT_)?([A-Za-z_]+)")


def _state(text: str | None) -> str:
    """"4: ACTIVE" (sysfs) or "PORT_ACTIVE (4)" (ibv_devinfo) -> "ACTIVE"."""
    m = _STATE.match(text or "")
    return m.group(1).upper() if m else "UNKNOWN"


def parse_ibv_devinfo(text: str) -> list[dict]:
    """`ibv_devinfo -v` as read_sysfs's dicts (no rate, no netdevs)."""
    out: list[dict] = []
    hca = None
    cur: dict | None = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("hca_id:"):
            hca, cur = s.split(":", 1)[1].strip(), None
        elif s.startswith("port:") and hca:
            num = s.split(":", 1)[1].strip()
            cur = {"hca": hca, "port": int(num) if num.isdigit() else num, "state": None, "phys_state": None,
                   "link_layer": None, "rate": None, "gids": [], "netdevs": []}
            out.append(cur)
        elif cur is not None and s.startswith(("state:", "phys_state:", "link_layer:")):
            k, _, v = s.partition(":")
            cur[k] = v.strip()
        elif cur is not None and s.startswith("GID["):
            m = re.match(r"GID\[\s*(\d+)\]:\s*([0-9a-fA-F:.]+)(?:,\s*(.+))?$", s)
            if m:
                cur["gids"].append({"index": int(m.group(1)), "gid": m.group(2), "type": m.group(3), "ndev": None})
    return out


def _ipv4_mapped(gid: str) -> bool:
    g = gid.lower()
    return g.startswith("::ffff:") or g.startswith("0000:0000:0000:0000:0000:ffff:")


def choose_gid(gids: list[dict]) -> dict | None:
    """The GID NCCL should use on a RoCE port (see the module docstring), or None when there is none."""
    def v2(g):
        return "v2" in (g.get("type") or "").lower()

    for ok in (lambda g: v2(g) and _ipv4_mapped(g["gid"]), v2, lambda g: True):
        for g in sorted(gids, key=lambda g: g["index"]):
            if ok(g):
                return g
    return None


def ports_from_probe(raw: list[dict]) -> list[IBPort]:
    ports = []
    for p in raw:
        if not str(p.get("port", "")).isdigit():
            continue  # not a port number: not something NCCL can be pointed at
        roce = (p.get("link_layer") or "").lower() == "ethernet"
        g = choose_gid(p.get("gids") or []) if roce else None
        ports.append(IBPort(hca=str(p.get("hca")), port=int(p["port"]), state=_state(p.get("state")),
                            link_layer=p.get("link_layer") or "unknown", rate=p.get("rate"),
                            gid_index=g["index"] if g else None, gid_type=g.get("type") if g else None,
                            netdev=(g.get("ndev") if g else None) or next(iter(p.get("netdevs") or []), None)))
    return ports


def active_ports(ports: list[IBPort]) -> list[IBPort]:
    return [p for p in ports if p.state == "ACTIVE" and p.link_layer.lower() in ("infiniband", "ethernet")]


def nccl_ib_env(ports: list[IBPort]) -> dict[str, str]:
    """NCCL_IB_HCA (the active ports, `=` for exact names: mlx5_1 would otherwise also pick mlx5_10) and
    NCCL_IB_GID_INDEX (when the node's active RoCE ports agree on one). Empty with no active port."""
    act = active_ports(ports)
    if not act:
        return {}
    env = {"NCCL_IB_HCA": "=" + ",".join(f"{p.hca}:{p.port}" for p in act)}
    idx = {p.gid_index for p in act if p.link_layer.lower() == "ethernet" and p.gid_index is not None}
    if len(idx) == 1:
        env["NCCL_IB_GID_INDEX"] = str(idx.pop())
    return env


def describe(ports: list[IBPort]) -> str:
    """One line for a node: `mlx5_0:1 IB ACTIVE, mlx5_1:1 RoCE ACTIVE gid 3 (RoCE v2)`."""
    out = []
    for p in ports:
        kind = "RoCE" if p.link_layer.lower() == "ethernet" else "IB" if p.link_layer.lower() == "infiniband" \
            else p.link_layer
        gid = f" gid {p.gid_index}" + (f" ({p.gid_type})" if p.gid_type else "") if p.gid_index is not None else ""
        out.append(f"{p.hca}:{p.port} {kind} {p.state}{gid}")
    return ", ".join(out)


# ---------------------------------------------------------------- NCCL's own account
_VIA = re.compile(r"NCCL INFO .*\bvia NET/([A-Za-z0-9_]+)")
_USING = re.compile(r"NCCL INFO Using network (\S+)")


def _family(name: str) -> str:
    """NCCL's network names: IB, IBext, IBext_v8 (the SHARP plugin) are InfiniBand/RoCE verbs."""
    return "IB" if name.startswith("IB") else name


def nccl_transport(log: str) -> str | None:
    """The network NCCL used between nodes, from one node's NCCL_DEBUG=INFO output: "IB", "Socket", another
    plugin's name, or None when the log says nothing (no NCCL, or a single node)."""
    via = {_family(m.group(1)) for m in _VIA.finditer(log)}
    if via:
        # a rank that connected over sockets while another used IB still fell back: report the worst
        return "Socket" if "Socket" in via else sorted(via)[0]
    using = {_family(m.group(1)) for m in _USING.finditer(log)}
    if using:
        return "Socket" if "Socket" in using else sorted(using)[0]
    return None
