"""SSH key setup, done for the user: what ssh-keygen + ssh-copy-id would do,
then the all-pairs check that torchrun/DeepSpeed launchers need.

1. `ensure_keypair`: an ed25519 key on this machine if there is none (private
   file 0600), generated with `cryptography` (paramiko cannot make ed25519).
2. `install_key`: the public key appended to every node's authorized_keys over a
   password login. The password is asked once by the caller, passed in memory,
   and never written anywhere. Idempotent: a line already present is not added.
3. Every node gets a key of its own (ssh-keygen on the node, if missing), every
   node's public key goes to every node, and every node learns the host keys
   that this machine verified, so node-to-node SSH works without a password or
   a prompt.
4. `pair_matrix`: from every node to every other node, `ssh -o BatchMode=yes
   ... true`; the matrix is the report.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from qwen_tui.nodes.connect import _ssh_config, resolve_target
from qwen_tui.nodes.programs import program
from qwen_tui.nodes.results import NodeResults, on_nodes
from qwen_tui.nodes.transport.hostkeys import Consent, known_hosts_line
from qwen_tui.nodes.transport.protocol import Transport, TransportError
from qwen_tui.nodes.transport.ssh import SSHTransport
from qwen_tui.preset.schema import Preset

# Appends lines to a file under ~/.ssh unless present; prints how many were added.
_APPEND_ONCE = program("append_once.sh")
# A key of the node's own, made by the node's ssh-keygen if it has none.
_NODE_KEY = program("node_key.sh")
_KEY_AUTHORIZED = program("key_authorized.sh")  # exit 0: the key is in ~/.ssh/authorized_keys


@dataclass
class KeyPair:
    private_path: str
    public_line: str
    created: bool
    encrypted: bool = False  # protected by a passphrase


class KeyLocked(ValueError):
    """The private key is protected by a passphrase that was not given (or is wrong)."""


def key_is_encrypted(path: str) -> bool:
    """True when the private key at `path` exists and needs a passphrase to be read."""
    priv = Path(os.path.expanduser(path))
    if not priv.exists():
        return False
    try:
        serialization.load_ssh_private_key(priv.read_bytes(), password=None)
    except TypeError:  # cryptography: "Password was not given but private key is encrypted"
        return True
    except ValueError:
        return False  # not an OpenSSH key at all: ensure_keypair says so
    return False


def ensure_keypair(path: str = "~/.ssh/id_ed25519", comment: str = "qwen-tui",
                   passphrase: str | None = None) -> KeyPair:
    """Load or create an ed25519 key pair (private 0600, public next to it). A key with a
    passphrase is read with `passphrase`, or, without one, known by its .pub file."""
    priv = Path(os.path.expanduser(path))
    pub = priv.with_name(priv.name + ".pub")
    if priv.exists():
        encrypted = key_is_encrypted(str(priv))
        if encrypted and passphrase is None:
            if not pub.exists():
                raise KeyLocked(f"{priv} is protected by a passphrase and has no {pub.name} next to it: "
                                "give the passphrase when asked, or load the key into ssh-agent")
            return KeyPair(str(priv), " ".join(pub.read_text().split()[:2]), created=False, encrypted=True)
        try:
            key = serialization.load_ssh_private_key(
                priv.read_bytes(), password=passphrase.encode() if encrypted and passphrase else None)
        except ValueError as e:
            why = "wrong passphrase" if encrypted else f"not an OpenSSH private key ({e})"
            raise KeyLocked(f"{priv}: cannot read the key: {why}") from None
        line = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                             serialization.PublicFormat.OpenSSH).decode()
        if pub.exists():
            line = " ".join(pub.read_text().split()[:2])
        return KeyPair(str(priv), line, created=False, encrypted=encrypted)
    priv.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Ed25519PrivateKey.generate()
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption())
    fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                         serialization.PublicFormat.OpenSSH).decode()
    pub.write_text(f"{line} {comment}\n")
    os.chmod(pub, 0o644)
    return KeyPair(str(priv), line, created=True)


def append_once(t: Transport, filename: str, lines: list[str], *, timeout: float = 20.0) -> int:
    """Add the lines missing from ~/.ssh/<filename> on the node; return how many were added."""
    r = t.run(["sh", "-c", _APPEND_ONCE, "sh", filename, *lines], timeout=timeout)
    if not r.ok:
        raise TransportError(f"{t.label}: cannot update ~/.ssh/{filename} (rc {r.rc}): {r.stderr.strip()}")
    return int(r.stdout.strip() or 0)


def _key_only(line: str) -> str:
    """`type base64` without the comment: what duplicates are judged by."""
    return " ".join(line.split()[:2])


@dataclass
class KeySetupReport:
    key: KeyPair
    installed: NodeResults  # node -> number of lines added to authorized_keys (0 = already there)
    mesh: NodeResults = field(default_factory=NodeResults)  # node -> lines added for node-to-node SSH
    matrix: dict[tuple[int, int], str | None] = field(default_factory=dict)  # (from, to) -> None ok | error

    @property
    def changed(self) -> bool:
        return self.key.created or any(v for v in self.installed.succeeded.values()) or \
            any(v for v in self.mesh.succeeded.values())

    @property
    def ok(self) -> bool:
        return self.installed.ok and self.mesh.ok and all(v is None for v in self.matrix.values())

    def matrix_lines(self, labels: list[str]) -> list[str]:
        out = []
        for (a, b), err in sorted(self.matrix.items()):
            out.append(f"{labels[a]} -> {labels[b]}: {'ok' if err is None else err}")
        return out


def identity_for(preset: Preset, identity: str | None = None) -> str:
    """The key ssh would use: explicit, else the preset's/ssh_config's IdentityFile, else the default."""
    config = _ssh_config(preset)
    targets = [resolve_target(n, preset, config) for n in preset.cluster.nodes if not n.is_local]
    configured = next((t.identity_files[0] for t in targets if t.identity_files), None)
    return identity or preset.cluster.identity_file or configured or "~/.ssh/id_ed25519"


def setup_keys(preset: Preset, password: str | None, *, identity: str | None = None,
               accept_new_host_keys: Consent = False, timeout: float = 60.0,
               passphrase: str | None = None) -> KeySetupReport:
    """The whole key step for every remote node; per-node results, never the first error.
    A key with a passphrase is used with `passphrase` (memory only) or, without one,
    through ssh-agent. Raises KeyLocked when the key cannot be used at all."""
    nodes = preset.cluster.nodes
    labels = {i: n.label for i, n in enumerate(nodes)}
    remote = [i for i, n in enumerate(nodes) if not n.is_local]
    config = _ssh_config(preset)
    targets = {i: resolve_target(nodes[i], preset, config) for i in remote}
    key = ensure_keypair(identity_for(preset, identity), passphrase=passphrase)
    for t in targets.values():
        t.identity_files = [key.private_path]  # a key that already works spares the password
        # a locked key without its passphrase can only be used through the agent
        t.look_for_keys = key.encrypted and passphrase is None

    def install(i: int) -> int:
        t = targets[i]
        tr = SSHTransport(t, password=password, accept_new_host_keys=accept_new_host_keys,
                          passphrase=passphrase).connect()
        try:
            return append_once(tr, "authorized_keys", [key.public_line + " qwen-tui"]
                               if not _present_check(tr, key.public_line) else [])
        finally:
            tr.close()

    installed = on_nodes(install, remote, timeout=timeout, labels=labels)
    report = KeySetupReport(key=key, installed=installed)
    ok_nodes = sorted(installed.succeeded)

    # From here on, log in with the key only: it proves the install worked.
    conns = on_nodes(lambda i: SSHTransport(targets[i], passphrase=passphrase).connect(), ok_nodes,
                     timeout=timeout, labels=labels)
    live = conns.succeeded
    try:
        node_keys = on_nodes(lambda i: _node_pubkey(live[i], labels[i]), list(live), timeout=timeout,
                             labels=labels)
        pubs = [_key_only(v) + f" {labels[i]}" for i, v in sorted(node_keys.succeeded.items())]
        host_lines = [known_hosts_line(targets[i].hostname, targets[i].port, live[i].server_key())
                      for i in sorted(live)]

        def mesh(i: int) -> int:
            if isinstance(node_keys.get(i), BaseException):
                raise node_keys[i]
            missing = [p for p in pubs if not _present_check(live[i], _key_only(p))]
            return append_once(live[i], "authorized_keys", missing) + \
                append_once(live[i], "known_hosts", host_lines)

        report.mesh = on_nodes(mesh, list(live), timeout=timeout, labels=labels)
        for i, e in conns.failed.items():
            report.mesh[i] = e
        report.matrix = pair_matrix(preset, live, targets, timeout=timeout)
    finally:
        for t in live.values():
            t.close()
    return report


def _present_check(t: Transport, key_line: str) -> bool:
    """Is this key (type + base64, any comment) already authorized on the node?"""
    r = t.run(["sh", "-c", _KEY_AUTHORIZED, "sh", _key_only(key_line)], timeout=15)
    return r.ok


def _node_pubkey(t: Transport, label: str) -> str:
    r = t.run(["sh", "-c", _NODE_KEY, "sh", f"qwen-tui@{label}"], timeout=30)
    if r.rc == 127 or "ssh-keygen: not found" in r.stderr or "command not found" in r.stderr:
        raise TransportError(f"{label}: ssh-keygen is missing (fix: apt-get install openssh-client)")
    if not r.ok or not r.stdout.strip():
        raise TransportError(f"{label}: cannot make the node's own key: {r.stderr.strip()}")
    return r.stdout.strip().splitlines()[-1]


def pair_matrix(preset: Preset, transports: dict[int, Transport], targets: dict, *,
                timeout: float = 60.0) -> dict[tuple[int, int], str | None]:
    """(from, to) -> None when node `from` logs into node `to` with no password and no prompt."""
    idx = sorted(transports)
    ct = max(1, int(preset.cluster.connect_timeout))

    def from_node(a: int) -> dict[int, str | None]:
        res: dict[int, str | None] = {}
        for b in idx:
            if b == a:
                continue
            tb = targets[b]
            r = transports[a].run(
                ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                 "-o", f"ConnectTimeout={ct}", "-p", str(tb.port), "-l", tb.user, "--", tb.hostname, "true"],
                timeout=ct + 10)
            res[b] = None if r.ok else (r.stderr.strip().splitlines() or [f"exit {r.rc}"])[-1]
        return res

    rows = on_nodes(from_node, idx, timeout=timeout)
    out: dict[tuple[int, int], str | None] = {}
    for a in idx:
        row = rows[a]
        for b in idx:
            if b != a:
                out[(a, b)] = str(row) if isinstance(row, BaseException) else row[b]
    return out
