"""A finding of the node checks: shaped like advice.Advice (level, code, message,
fix) so the same table prints both, plus where it belongs in the node x check
matrix (node index, check column)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

ERROR, WARNING, INFO = "error", "warning", "info"
_RANK = {ERROR: 2, WARNING: 1, INFO: 0}


@dataclass
class Finding:
    level: str  # error | warning | info
    code: str
    message: str
    fix: str = ""
    node: Optional[int] = None  # None: the cluster as a whole
    check: str = ""  # matrix column: ssh, probe, gpu, python, code, data, model, disk, port, nccl-ports, firewall, bandwidth, rehearsal

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def worst(levels) -> Optional[str]:
    levels = list(levels)
    return max(levels, key=lambda x: _RANK[x]) if levels else None


def connect_fix(e: BaseException) -> str:
    """What to do about a node that could not be connected (the checks' and the launch's advice)."""
    name = type(e).__name__
    if name == "UnknownHostKey":
        return "verify the fingerprint, then rerun with --accept-new-host-keys"
    if name == "ChangedHostKey":
        return "find out why the key changed before removing the old known_hosts entry"
    if name == "AuthFailed":
        return "set up keys: qwen-tui keys PRESET (asks the password once)"
    return "check the host name, port and that sshd runs (ssh -v HOST)"
