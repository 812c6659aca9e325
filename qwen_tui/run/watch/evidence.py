"""The evidence at hand about a slow node, in one line: its GPUs' utilisation, SM clock and temperature,
its CPU load against its cores, and the link the checks measured to it. One bounded command on the node;
what cannot be read is left out, never guessed."""

from __future__ import annotations

from ...nodes.programs import program
from ...nodes.transport.protocol import Transport

# Prints the load average and core count, then one CSV line per GPU (nothing where there is no nvidia-smi).
_PROBE = program("slow_node_evidence.sh")


def parse_evidence(text: str) -> list[str]:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    out: list[str] = []
    if len(lines) >= 2 and lines[1].isdigit():
        try:
            load = float(lines[0].split()[0])
            out.append(f"CPU load {load:.1f} on {lines[1]} cores")
        except (ValueError, IndexError):
            pass
        lines = lines[2:]
    gpus = []
    for ln in lines:
        f = [x.strip() for x in ln.split(",")]
        if len(f) == 4 and all(x.replace(".", "", 1).isdigit() for x in f):
            util, sm, sm_max, temp = (float(x) for x in f)
            gpus.append(f"{util:.0f}% at {sm:.0f}/{sm_max:.0f} MHz, {temp:.0f} C")
    if gpus:
        out.append("GPUs " + "; ".join(gpus))
    return out


def node_evidence(t: Transport, link_gbps: float | None) -> str:
    try:
        res = t.run(["sh", "-c", _PROBE], timeout=15)
        parts = parse_evidence(res.stdout) if res.ok else []
    except Exception as e:
        parts = [f"the node did not answer ({type(e).__name__})"]
    if link_gbps is not None:
        parts.append(f"link to the master {link_gbps:.1f} Gbit/s (checks)")
    else:
        parts.append("link not measured")
    return "; ".join(parts)


# The node's kernel log since the run began ($1: seconds ago), ISO-stamped, as far as this user may read it (journalctl
# -k serves the adm and systemd-journal groups; dmesg is often root's only): GPU Xid reports are written there, not to
# any log of the run's own. Empty where neither answers.
KERNEL_LOG = ('journalctl -k --since "-${1}s" -o short-iso --no-pager -q 2>/dev/null && exit 0; '
              "dmesg --time-format iso 2>/dev/null | tail -n 2000; exit 0")


def _stamp(line: str) -> float | None:
    """The epoch seconds of an ISO-stamped kernel-log line (journalctl's short-iso, dmesg's iso), or None."""
    import datetime

    head = line.split(" ", 1)[0].replace(",", ".")
    try:
        t = datetime.datetime.fromisoformat(head.replace("+0000", "+00:00"))
    except ValueError:
        return None
    return t.timestamp() if t.tzinfo is not None else None


def kernel_faults(text: str, since: float | None = None) -> list[tuple[str, str, str, str]]:
    """The hardware faults (cluster/hardware_faults.py) in kernel-log text, newest first: (code, cause, fix, line);
    with `since` (epoch seconds), only those of stamped lines at or after it (an Xid of last week is not this run's)."""
    from ...cluster.hardware_faults import hardware_fault

    out = []
    for ln in reversed(text.splitlines()):
        hw = hardware_fault(ln)
        if hw is None:
            continue
        at = _stamp(ln)
        if since is not None and (at is None or at < since):
            continue
        out.append((*hw, ln.strip()[:300]))
    return out


def node_kernel_faults(t: Transport, since: float, now: float) -> list[tuple[str, str, str, str]]:
    """kernel_faults of node `t`'s kernel log since epoch `since`; [] where it cannot be read (one bounded command)."""
    try:
        res = t.run(["sh", "-c", KERNEL_LOG, "sh", str(int(now - since) + 60)], timeout=10)
    except Exception:  # a node that does not answer has no kernel log to offer: the verdict goes on without it
        return []
    return kernel_faults(res.stdout, since - 60) if res.ok else []
