"""The evidence at hand about a slow node, in one line: its GPUs' utilisation, SM clock and temperature,
its CPU load against its cores, and the link the checks measured to it. One bounded command on the node;
what cannot be read is left out, never guessed."""

from __future__ import annotations

from ..nodes.programs import program
from ..nodes.transport import Transport

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
