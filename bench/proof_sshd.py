"""Two "nodes" on this machine for the GPU proof: one OpenSSH sshd each, on spare ports of 127.0.0.1, with a
throwaway key pair, an ssh_config naming them proof-node-0 and proof-node-1, and each node's share of the GPUs.

A bare GPU machine has no sshd configured (and maybe none installed): this sets up what qwen-tui's own launcher
needs to reach a node over SSH, as a user's cluster would have it, and takes it down again. Each sshd gives its
sessions the node's environment (sshd_config SetEnv): CUDA_VISIBLE_DEVICES (its GPUs), PYTHONPATH (the
packages carried beside the image's) and the NCCL settings the machine must keep. Keys are made with
`cryptography` (no ssh-keygen needed); the client key is the preset's identity_file, and the host keys are
recorded the first time qwen-tui connects (--accept-new-host-keys), in a known_hosts file of the proof's own.

If no sshd is installed, an OpenSSH server unpacked from a carried Debian package (`dpkg -x` of
openssh-server_*.deb under CARRY, e.g. .whl/) is used; none at all makes the lines that need it skip, saying so.
"""

from __future__ import annotations

import getpass
import glob
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")


def find_sshd(carry: Path | None, scratch: Path) -> tuple[str | None, str]:
    """(path of an sshd, how it was found) or (None, why there is none)."""
    for p in (shutil.which("sshd"), *SSHD_CANDIDATES):
        if p and os.access(p, os.X_OK):
            return p, "installed"
    debs = sorted(glob.glob(str(carry / "openssh-server_*.deb"))) if carry else []
    if debs and shutil.which("dpkg"):
        root = scratch / "openssh-root"
        for d in sorted(glob.glob(str(carry / "openssh-*.deb"))):
            subprocess.run(["dpkg", "-x", d, str(root)], check=True, timeout=60)
        p = root / "usr" / "sbin" / "sshd"
        if p.is_file():
            return str(p), f"unpacked from {Path(debs[-1]).name}"
    return None, ("no sshd on this machine: install openssh-server, or carry its Debian package "
                  "(python bench/gpu_proof.py --fetch-wheels .whl fetches it) ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keypair(path: Path) -> str:
    """An ed25519 key in OpenSSH's private format at `path` (0600); returns the public key line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def _listening(proc: subprocess.Popen, port: int, deadline: float) -> bool:
    """True once the sshd accepts on its port; False if it exited first or the deadline passed (it is stopped)."""
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    return False


@dataclass
class Nodes:
    """The two nodes, up: what a preset needs to reach them."""

    dir: Path
    ports: list[int]
    ssh_config: Path
    known_hosts: Path
    identity: Path
    user: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    how: str = ""  # how the sshd was found (installed, or unpacked from a carried package)
    gpus: list[str] = field(default_factory=list)  # each node's CUDA_VISIBLE_DEVICES

    @property
    def hosts(self) -> list[str]:
        return [f"proof-node-{i}" for i in range(len(self.ports))]

    def down(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def up(sshd: str, scratch: Path, node_env: list[dict[str, str]], bound_s: float = 20.0) -> Nodes:
    """Starts one sshd per entry of `node_env` (the variables that node's sessions get) and waits for each port."""
    d = scratch / "sshd"
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    user = getpass.getuser()
    identity = d / "id_ed25519"
    (d / "authorized_keys").write_text(_keypair(identity) + "\n")
    (d / "authorized_keys").chmod(0o600)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation's empty directory
        try:
            import pwd

            pwd.getpwnam("sshd")
        except KeyError:  # an image without openssh-server has no privilege separation user either
            subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/run/sshd", "--shell",
                            "/usr/sbin/nologin", "sshd"], check=True, timeout=30)
    nodes = Nodes(dir=d, ports=[], ssh_config=d / "ssh_config", known_hosts=d / "known_hosts", identity=identity,
                  user=user)
    nodes.known_hosts.touch(mode=0o600)
    cfg = []
    try:
        for i, env in enumerate(node_env):
            host_key = d / f"host_key_{i}"
            _keypair(host_key)
            sets = " ".join(f'"{k}={v}"' for k, v in env.items())
            for attempt in range(3):  # a spare port can be taken between asking and binding: then another
                port = free_port()
                conf = d / f"sshd_config_{i}"
                conf.write_text("\n".join([
                    "ListenAddress 127.0.0.1", f"Port {port}", f"HostKey {host_key}", f"PidFile {d}/sshd_{i}.pid",
                    "PermitRootLogin prohibit-password", "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no", "PubkeyAuthentication yes", "UsePAM no", "StrictModes no",
                    f"AuthorizedKeysFile {d}/authorized_keys", "Subsystem sftp internal-sftp",
                    *([f"SetEnv {sets}"] if sets else []), "LogLevel ERROR", ""]))
                with open(d / f"sshd_{i}.log", "ab") as log:
                    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(conf)], stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=log, start_new_session=True)
                if _listening(proc, port, time.monotonic() + bound_s):
                    break
                said = (d / f"sshd_{i}.log").read_text(errors="replace")[-600:]
                if "Address already in use" not in said or attempt == 2:
                    raise RuntimeError(f"sshd for proof-node-{i} did not listen on {port}: {said or 'no output'}")
            nodes.procs.append(proc)
            nodes.ports.append(port)
            cfg += [f"Host proof-node-{i}", "  HostName 127.0.0.1", f"  Port {port}", f"  User {user}",
                    f"  IdentityFile {identity}", "  IdentitiesOnly yes", ""]
        nodes.ssh_config.write_text("\n".join(cfg))
    except BaseException:
        nodes.down()
        raise
    return nodes
