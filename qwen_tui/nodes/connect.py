"""From a preset node to a connected Transport.

`resolve_target` applies ssh_config the way OpenSSH does (nodes/transport/sshconfig.py:
`ssh -G` where the client exists, else paramiko with Include expanded): what the
preset says explicitly wins, then the ssh_config value (HostName, User, Port,
IdentityFile, ConnectTimeout, UserKnownHostsFile, ProxyJump), then the defaults.
localhost nodes get a LocalTransport (plain processes, no SSH).

ProxyJump `[user@]host[:port][,...]` is followed hop by hop, as `ssh -J` does: each
hop's own ssh_config entry applies (HostName, User, Port, IdentityFile, and its own
ProxyJump when it is the first hop), the hops' host keys are verified like the
node's, and a loop or a chain longer than 8 hops is refused. ProxyCommand is
refused with a clear error rather than ignored: it would run an arbitrary local
command, and connecting directly instead would fail in a confusing way.
"""

from __future__ import annotations

import getpass
import os

from qwen_tui.nodes.results import NodeResults, on_nodes
from qwen_tui.nodes.transport import sshconfig
from qwen_tui.nodes.transport.hostkeys import Consent
from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.nodes.transport.protocol import Transport, TransportError
from qwen_tui.nodes.transport.ssh import SSHTarget, SSHTransport
from qwen_tui.nodes.transport.sshconfig import SSHConfigLookup
from qwen_tui.preset.schema import Node, Preset

DEFAULT_KEY = "~/.ssh/id_ed25519"


def _ssh_config(preset: Preset) -> SSHConfigLookup | None:
    """The preset's ssh_config (default: the user's own), read as OpenSSH reads it."""
    return sshconfig.load(preset.cluster.ssh_config)


MAX_JUMPS = 8


def resolve_target(node: Node, preset: Preset, config: SSHConfigLookup | None = None) -> SSHTarget:
    cfg = dict(config.lookup(node.host)) if config is not None else {}
    user = node.user or cfg.get("user") or getpass.getuser()
    if "port" in node.model_fields_set:
        port = node.port
    else:
        port = _port(cfg.get("port", node.port), node.label, node.host)
    target = _target(node.label, node.host, cfg, user, port, preset)
    target.jump = _jumps(node.label, node.host, cfg, preset, config)
    return target


def _port(value, label: str, host: str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = 0
    if not 0 < port < 65536:
        raise TransportError(f"{label}: ssh_config gives {host} the port {value!r}, not a TCP port")
    return port


def _jumps(label: str, host: str, cfg: dict, preset: Preset, config: SSHConfigLookup | None,
           seen: frozenset = frozenset(), depth: int = 0) -> SSHTarget | None:
    """The ProxyJump chain in front of `host` as nested SSHTargets (the hop next to it outermost), or None.
    As with `ssh -J a,b`: b is reached through a, and only the first hop's own ProxyJump is followed."""
    if (cfg.get("proxycommand") or "none").lower() != "none":
        raise TransportError(f"{label}: ssh_config gives {host} a ProxyCommand, which qwen-tui does not run; "
                             "use ProxyJump (the same as ssh -J) for a jump host")
    spec = cfg.get("proxyjump", "none").strip()
    if spec.lower() == "none":
        return None
    hops = [h.strip() for h in spec.split(",")]
    if "" in hops or depth + len(hops) > MAX_JUMPS:
        raise TransportError(f"{label}: ssh_config ProxyJump {spec!r} for {host} is not a chain of 1 to "
                             f"{MAX_JUMPS} [user@]host[:port] hops")
    seen = seen | {host}
    prev: SSHTarget | None = None
    for k, hop in enumerate(hops):
        user, _, rest = hop.rpartition("@")
        name, port_text = rest, None
        if rest.startswith("["):  # [address]:port
            name, _, tail = rest[1:].partition("]")
            port_text = tail[1:] if tail.startswith(":") else None
        elif rest.count(":") == 1:
            name, port_text = rest.split(":")
        if not name:
            raise TransportError(f"{label}: ssh_config ProxyJump {spec!r} for {host} has no host in {hop!r}")
        if name in seen:
            raise TransportError(f"{label}: ssh_config ProxyJump {spec!r} for {host} loops back to {name}")
        hcfg = dict(config.lookup(name)) if config is not None else {}
        hlabel = f"{label} via jump host {name}"
        port = _port(port_text if port_text is not None else hcfg.get("port", 22), hlabel, name)
        t = _target(hlabel, name, hcfg, user or hcfg.get("user") or getpass.getuser(), port, preset)
        t.jump = prev if k else _jumps(hlabel, name, hcfg, preset, config, seen | set(hops), depth + len(hops))
        prev = t
    return prev


def _target(label: str, host: str, cfg: dict, user: str, port: int, preset: Preset) -> SSHTarget:
    """One host's SSHTarget from its ssh_config entry and the preset's cluster settings (no jump)."""
    c = preset.cluster
    hostname = cfg.get("hostname", host)
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
    return SSHTarget(label=label, hostname=hostname, port=port, user=user,
                     identity_files=[os.path.expanduser(p) for p in identities],
                     known_hosts=os.path.expanduser(known), connect_timeout=timeout,
                     look_for_keys=look_for_keys)


def transport_for(node: Node, preset: Preset, *, accept_new_host_keys: Consent = False,
                  password: str | None = None) -> Transport:
    """A connected Transport for one node (raises TransportError and its kinds): this machine's own, a node of
    the SLURM allocation the preset runs in (its command server started and answering), or SSH."""
    if preset.scheduler.is_slurm:
        return _slurm_transport(node, preset)
    if node.is_local:
        return LocalTransport(node.label)
    target = resolve_target(node, preset, _ssh_config(preset))
    return SSHTransport(target, password=password, accept_new_host_keys=accept_new_host_keys).connect()


def _slurm_transport(node: Node, preset: Preset) -> Transport:
    from qwen_tui.nodes.slurm.transport import SlurmTransport

    job = preset.scheduler.job_id
    if job is None:
        raise TransportError(f"{node.label}: a SLURM preset reaches its nodes inside an allocation; this one names "
                             "none (run it with salloc, inside a batch job, or let qwen-tui replay submit it)")
    t = SlurmTransport(node.label, node.host, job, python=node.python, start_bound=connect_bound(preset))
    try:
        t.home()  # the node's command server answers: the node is reached
    except TransportError:
        t.close()
        raise
    return t


def connect_all(preset: Preset, *, accept_new_host_keys: Consent = False,
                password: str | None = None, timeout: float | None = None) -> NodeResults:
    """Connect to every node in parallel: node index -> Transport | exception."""
    nodes = preset.cluster.nodes
    return on_nodes(lambda i: transport_for(nodes[i], preset, accept_new_host_keys=accept_new_host_keys,
                                            password=password),
                    range(len(nodes)), timeout=timeout or connect_bound(preset), labels={i: n.label for i, n in enumerate(nodes)})


def connect_bound(preset: Preset) -> float:
    """How long connecting every node (in parallel) may take: TCP + banner + auth, once for the
    node and once for each ProxyJump hop in front of it."""
    return preset.cluster.connect_timeout * 3 * (1 + _most_hops(preset)) + 5


def _most_hops(preset: Preset) -> int:
    """The longest ProxyJump chain in front of any node (a node whose ssh_config cannot be used counts 0: its
    own connection attempt reports why)."""
    most = 0
    try:
        config = _ssh_config(preset)
    except TransportError:
        return 0
    for node in preset.cluster.nodes:
        if node.is_local:
            continue
        try:
            t = resolve_target(node, preset, config).jump
        except TransportError:
            continue
        n = 0
        while t is not None:
            n, t = n + 1, t.jump
        most = max(most, n)
    return most


def close_all(transports: NodeResults | dict) -> None:
    for t in transports.values():
        if not isinstance(t, BaseException):
            t.close()
