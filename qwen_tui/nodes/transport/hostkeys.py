"""Host key verification: known_hosts first, a new key only with consent, a
changed key never.

paramiko's RejectPolicy/AutoAddPolicy are the two extremes; `ConsentPolicy` sits
between them: an unknown key is accepted only when the caller said yes (a flag
headless, a prompt in the wizard) and is then appended to known_hosts. A key that
differs from the recorded one is refused by paramiko before any policy runs
(BadHostKeyException); `changed_key_error` turns that into a message that names
the node and both fingerprints.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import paramiko

from qwen_tui.nodes.transport.protocol import TransportError

# Consent: a fixed answer, or a question asked with (node label, host name, key).
Consent = bool | Callable[[str, str, paramiko.PKey], bool]

_write_lock = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint, as `ssh-keygen -l` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def known_hosts_line(host: str, port: int, key: paramiko.PKey) -> str:
    return f"{known_hosts_name(host, port)} {key.get_name()} {key.get_base64()}"


class HostKeyError(TransportError):
    """The node's host key could not be trusted."""


class UnknownHostKey(HostKeyError):
    def __init__(self, label: str, host: str, key: paramiko.PKey, known_hosts: str):
        self.label, self.host, self.fingerprint = label, host, fingerprint(key)
        super().__init__(
            f"{label}: unknown host key for {host} ({key.get_name()} {self.fingerprint}), "
            f"not in {known_hosts}. Check the fingerprint on the node "
            f"(ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub) and accept it with "
            f"--accept-new-host-keys")


class ChangedHostKey(HostKeyError):
    def __init__(self, label: str, host: str, offered: paramiko.PKey, recorded: paramiko.PKey,
                 known_hosts: str):
        self.label, self.host = label, host
        self.offered, self.recorded = fingerprint(offered), fingerprint(recorded)
        super().__init__(
            f"{label}: HOST KEY CHANGED for {host}: {known_hosts} has {recorded.get_name()} "
            f"{self.recorded}, the server offered {offered.get_name()} {self.offered}. "
            f"Refusing to connect (someone may be intercepting, or the node was reinstalled: "
            f"then remove the old entry with ssh-keygen -R '{host}' -f {known_hosts})")


def record_host_key(path: str, host: str, port: int, key: paramiko.PKey) -> bool:
    """Append a known_hosts line unless it is already there. True when written."""
    line = known_hosts_line(host, port, key)
    p = Path(path).expanduser()
    with _write_lock:
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # other qwen-tui processes append too
            f.seek(0)
            text = f.read()
            if line in text.splitlines():
                return False
            if text and not text.endswith("\n"):
                f.write("\n")
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
    return True


class ConsentPolicy(paramiko.MissingHostKeyPolicy):
    """Accept an unknown host key only with consent, and then record it."""

    def __init__(self, label: str, host: str, port: int, known_hosts: str, consent: Consent):
        self.label, self.host, self.port = label, host, port
        self.known_hosts, self.consent = known_hosts, consent

    def missing_host_key(self, client, hostname, key):
        ok = self.consent(self.label, hostname, key) if callable(self.consent) else bool(self.consent)
        if not ok:
            raise UnknownHostKey(self.label, hostname, key, self.known_hosts)
        record_host_key(self.known_hosts, self.host, self.port, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
