# The HCA ports under /sys/class/infiniband, one dict per port: what qwen_tui.ib.ports_from_probe reads.
# Part of the probe (program("probe.py") puts it first); it only defines read_sysfs(root), which the probe calls.
def read_sysfs(root: str = "/sys/class/infiniband") -> list:
    """One dict per HCA port under `root`. Runs on the node (standard library only, imports inside)."""
    import os

    def rd(*parts):
        try:
            with open(os.path.join(*parts)) as f:
                return f.read().strip()
        except (OSError, ValueError):  # an unpopulated GID attribute reads as EINVAL
            return None

    def ls(*parts):
        try:
            return sorted(os.listdir(os.path.join(*parts)), key=lambda x: (len(x), x))
        except OSError:
            return []

    out = []
    for hca in ls(root):
        netdevs = ls(root, hca, "device", "net")
        for port in ls(root, hca, "ports"):
            d = os.path.join(root, hca, "ports", port)
            gids = []
            for g in ls(d, "gids"):
                gid = rd(d, "gids", g)
                if not g.isdigit() or not gid or not gid.replace("0", "").replace(":", ""):
                    continue  # an empty slot of the GID table
                gids.append({"index": int(g), "gid": gid, "type": rd(d, "gid_attrs", "types", g),
                             "ndev": rd(d, "gid_attrs", "ndevs", g)})
            out.append({"hca": hca, "port": int(port) if port.isdigit() else port, "state": rd(d, "state"),
                        "phys_state": rd(d, "phys_state"), "link_layer": rd(d, "link_layer"),
                        "rate": rd(d, "rate"), "gids": gids, "netdevs": netdevs})
    return out
