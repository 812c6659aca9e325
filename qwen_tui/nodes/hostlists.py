"""Node lists people already have, turned into preset nodes: an MPI/DeepSpeed
hostfile (`host slots=N`), a SLURM node list (`gpu[01-04,07],login1`) and the
Host entries of an ssh_config. Pure functions: the wizard's import dialog calls them."""

from __future__ import annotations

import re
import shlex
from typing import Any

KINDS = ("hostfile", "slurm", "ssh_config")


# A host as ssh and torchrun take it: a DNS name, an ssh_config alias, an IPv4 or IPv6 address (`%zone` kept)
_HOST = re.compile(r"[A-Za-z0-9_:](?:[A-Za-z0-9_.:%-]*[A-Za-z0-9_.])?|\[[0-9A-Fa-f:.%A-Za-z]+\]")
_SLOTS = ("slots", "max_slots", "max-slots")


def host_problem(host: str) -> str:
    """Why `host` cannot be a node's host ("" when it can): what the wizard says as it is typed and what a
    hostfile import names per line, before any connection is tried."""
    if not host:
        return "is empty"
    if any(c.isspace() for c in host):
        return f"{host!r} holds a space: one host per node"
    if "@" in host:
        return f"{host!r} holds a user: put the user in its own field"
    if host.startswith("-"):
        return f"{host!r} starts with '-': ssh would read it as an option"
    if not _HOST.fullmatch(host):
        bad = sorted({c for c in host if not (c.isalnum() or c in "_.:%-[]")})
        return (f"{host!r} is not a host name or address" +
                (f" (it holds {' '.join(repr(c) for c in bad)})" if bad else ""))
    return ""


def parse_hostfile(text: str) -> list[dict[str, Any]]:
    """`host slots=N` lines (DeepSpeed/OpenMPI); `#` comments; slots default to 1. A line that is not one
    of these raises ValueError naming every such line and its problem: nothing is imported by halves."""
    out, problems = [], []
    for n, raw in enumerate(text.splitlines(), start=1):
        ln = raw.split("#", 1)[0].strip()
        if not ln:
            continue
        host, *opts = ln.split()
        node: dict[str, Any] = {"host": host}
        why = host_problem(host)
        for o in opts:
            k, eq, v = o.partition("=")
            if k not in _SLOTS or not eq:
                why = why or f"{o!r} is not slots=N"
            elif not v.isdigit() or not 1 <= int(v) <= 64:
                why = why or f"slots must be a whole number from 1 to 64, got {v!r}"
            elif k == "slots" or "gpus" not in node:
                node["gpus"] = int(v)
        if why:
            problems.append(f"line {n}: {raw.strip()}: {why}")
        else:
            out.append(node)
    if problems:
        raise ValueError("\n".join(["not a hostfile line (host slots=N):", *problems]))
    return out


def expand_slurm(nodelist: str) -> list[str]:
    """SLURM's compressed host list: `a[01-03,7],b` -> a01 a02 a03 a7 b (zero padding kept)."""
    names: list[str] = []
    parts = re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", nodelist.replace(" ", ""))
    for part in parts:
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            if part:
                names.append(part)
            continue
        prefix, ranges, rest = m.groups()
        suffixes = expand_slurm(rest) if "[" in rest else [rest]
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if hi:
                if not (lo.isdigit() and hi.isdigit()):
                    raise ValueError(f"not a SLURM range: {r!r}")
                width = len(lo)
                for n in range(int(lo), int(hi) + 1):
                    names += [f"{prefix}{n:0{width}d}{s}" for s in suffixes]
            else:
                names += [f"{prefix}{lo}{s}" for s in suffixes]
    return names


def parse_slurm(text: str) -> list[dict[str, Any]]:
    return [{"host": h} for h in expand_slurm(",".join(text.split()))]


def parse_ssh_config(text: str) -> list[dict[str, Any]]:
    """Concrete `Host` aliases (no wildcards or negations), in any of OpenSSH's spellings (`Host a b`,
    `Host=a`, `host = "a"`); the alias is kept as the host so ssh_config's HostName/User/Port still
    apply when connecting. Give it the text with Includes expanded (nodes.transport.sshconfig.import_text)."""
    from qwen_tui.nodes.transport.sshconfig import split_line

    out, seen = [], set()
    for ln in text.splitlines():
        key, args = split_line(ln)
        if key != "host":
            continue
        try:
            aliases = shlex.split(args)
        except ValueError:
            aliases = args.split()
        for alias in aliases:
            if any(c in alias for c in "*?!") or alias in seen:
                continue
            seen.add(alias)
            out.append({"host": alias})
    return out


def parse(kind: str, text: str) -> list[dict[str, Any]]:
    fn = {"hostfile": parse_hostfile, "slurm": parse_slurm, "ssh_config": parse_ssh_config}.get(kind)
    if fn is None:
        raise ValueError(f"unknown node list kind {kind!r}; one of {', '.join(KINDS)}")
    nodes = fn(text)
    if not nodes:
        raise ValueError(f"no nodes found in that {kind}")
    return nodes
