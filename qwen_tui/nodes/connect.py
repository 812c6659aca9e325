"""From a preset node to a connected Transport.

`resolve_target` applies ssh_config the way OpenSSH does: what the preset says
explicitly wins, then the first matching ssh_config value (HostName, User, Port,
IdentityFile, ConnectTimeout, UserKnownHostsFile), then the defaults. localhost
nodes get a LocalTransport (plain processes, no SSH).
"""

from __future__ import annotations

import getpass
import os
from typing import Optional

import paramiko

from qwen_tui.nodes.hostkeys import Consent
from qwen_tui.nodes.results import NodeResults, on_nodes
from qwen_tui.nodes.ssh import SSHTarget, SSHTransport
from qwen_tui.nodes.transport import LocalTransport, Transport, TransportError
from qwen_tui.preset import Node, Preset

DEFAULT_KEY = "~/.ssh/id_ed25519"


def _ssh_config(preset: Preset) -> Optional[paramiko.SSHConfig]:
    path = preset.cluster.ssh_config or "~/.ssh/config"
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        if preset.cluster.ssh_config:
            raise TransportError(f"cluster.ssh_config: {path} does not exist")
        return None
    try:
        return paramiko.SSHConfig.from_path(path)
    except (OSError, paramiko.SSHException, ValueError) as e:
        raise TransportError(f"cluster.ssh_config: cannot read {path}: {e}") from None


def resolve_target(node: Node, preset: Preset, config: Optional[paramiko.SSHConfig] = None) -> SSHTarget:
    c = preset.cluster
    cfg = dict(config.lookup(node.host)) if config is not None else {}
    hostname = cfg.get("hostname", node.host)
    user = node.user or cfg.get("user") or getpass.getuser()
    if "port" in node.model_fields_set:
        port = node.port
    else:
        port = int(cfg.get("port", node.port))
    identities: list[str] = []
    if c.identity_file:
        identities = [c.identity_file]
    elif cfg.get("identityfile"):
        identities = list(cfg["identityfile"])
    look_for_keys = not identities
    if not identities and os.path.exists(os.path.expanduser(DEFAULT_KEY)):
        identities = [DEFAULT_KEY]
    timeout = c.connect_timeout
    if "connect_timeout" not in c.model_fields_set and cfg.get("connecttimeout"):
        timeout = float(cfg["connecttimeout"])
    known = c.known_hosts or (cfg.get("userknownhostsfile", "").split() or ["~/.ssh/known_hosts"])[0]
    return SSHTarget(label=node.label, hostname=hostname, port=port, user=user,
                     identity_files=[os.path.expanduser(p) for p in identities],
                     known_hosts=os.path.expanduser(known), connect_timeout=timeout,
                     look_for_keys=look_for_keys)


def transport_for(node: Node, preset: Preset, *, accept_new_host_keys: Consent = False,
                  password: Optional[str] = None) -> Transport:
    """A connected Transport for one node (raises TransportError and its kinds)."""
    if node.is_local:
        return LocalTransport(node.label)
    target = resolve_target(node, preset, _ssh_config(preset))
    return SSHTransport(target, password=password, accept_new_host_keys=accept_new_host_keys).connect()


def connect_all(preset: Preset, *, accept_new_host_keys: Consent = False,
                password: Optional[str] = None, timeout: Optional[float] = None) -> NodeResults:
    """Connect to every node in parallel: node index -> Transport | exception."""
    nodes = preset.cluster.nodes
    bound = timeout or preset.cluster.connect_timeout * 3 + 5  # TCP + banner + auth
    return on_nodes(lambda i: transport_for(nodes[i], preset, accept_new_host_keys=accept_new_host_keys,
                                            password=password),
                    range(len(nodes)), timeout=bound, labels={i: n.label for i, n in enumerate(nodes)})


def close_all(transports: NodeResults | dict) -> None:
    for t in transports.values():
        if not isinstance(t, BaseException):
            t.close()
