"""Node lists people already have, turned into preset nodes: an MPI/DeepSpeed
hostfile (`host slots=N`), a SLURM node list (`gpu[01-04,07],login1`) and the
Host entries of an ssh_config. Pure functions: the wizard's import dialog calls them."""

from __future__ import annotations

import re
import shlex
from typing import Any

KINDS = ("hostfile", "slurm", "ssh_config")


def parse_hostfile(text: str) -> list[dict[str, Any]]:
    """`host slots=N` lines (DeepSpeed/OpenMPI); `#` comments; slots default to 1."""
    out = []
    for ln in text.splitlines():
        ln = ln.split("#", 1)[0].strip()
        if not ln:
            continue
        host, *opts = ln.split()
        node: dict[str, Any] = {"host": host}
        for o in opts:
            k, _, v = o.partition("=")
            if k in ("slots", "max_slots", "max-slots") and v.isdigit():
                node["gpus"] = int(v)
        out.append(node)
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
    apply when connecting. Give it the text with Includes expanded (nodes.sshconfig.import_text)."""
    from qwen_tui.nodes.sshconfig import split_line

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
