"""A finding of the node checks: an Issue (level, code, message) like advice.Advice, so the same table prints
both, with a fix in words and where it belongs in the node x check matrix (node index, check column)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ...base.levels import Issue, Level

ERROR, WARNING, INFO = Level.ERROR, Level.WARNING, Level.INFO  # the short names the checks write


@dataclass(frozen=True)
class Finding(Issue):
    fix: str = ""
    node: int | None = None  # None: the cluster as a whole
    check: str = ""  # matrix column: ssh, probe, gpu, python, code, data, model, disk, port, nccl-ports, firewall, bandwidth, rehearsal

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "level": str(self.level)}


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
