"""A cluster of network namespaces on one machine, one sshd per node.

Layout (all under one id so that concurrent sessions do not collide):
  bridge namespace  qt<id>br: bridge br0 (kept out of the root namespace, whose
                    FORWARD rules can drop bridged traffic)
  node namespace    qt<id>n<i>: eth0 = 10.A.B.(11+i)/24, veth onto br0
  root namespace    qt<id>h = 10.A.B.1/24, veth onto br0: where the tests (the
                    "laptop" running qwen-tui) reach the nodes from
Each node's sshd runs under `unshare --uts --mount --pid --fork --mount-proc`:
its own hostname, its own home for root (an /etc/passwd whose root entry points
at the node's directory: authorized_keys, known_hosts; /root itself stays
visible because Python may live there), its own /etc/shadow (a root password),
/etc/hosts, and its own process table with sshd
as init (which reaps orphans). The rest of the filesystem is shared, so the
host's Python venv is every node's Python.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REQUIRED_TOOLS = ("ip", "unshare", "sshd", "ssh-keygen", "openssl", "iptables", "tc", "iperf3", "setsid")


def sh(*argv: str, check: bool = True, timeout: float = 20, input: bytes | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(list(argv), capture_output=True, timeout=timeout, input=input)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} -> {p.returncode}: {p.stderr.decode(errors='replace').strip()}")
    return p


@dataclass
class NSNode:
    index: int
    netns: str
    hostname: str
    addr: str
    dir: Path  # host-side directory with this node's files

    @property
    def home(self) -> Path:
        """root's home on the node."""
        return self.dir / "home"


class NetnsCluster:
    def __init__(self, base: Path, n: int = 3, password: str = "", user: str = "root"):
        if os.geteuid() != 0:
            raise RuntimeError("the namespace cluster needs root (network namespaces, sshd)")
        missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
        if missing:
            raise RuntimeError(f"the namespace cluster needs {', '.join(missing)} "
                               "(apt-get install iproute2 util-linux openssh-server openssl iptables iperf3)")
        self.id = f"{os.getpid() % 100000:05d}"
        self.base = base
        self.password = password
        self.user = user
        a, b = self._free_subnet()
        self.prefix = f"10.{a}.{b}"
        self.host_addr = f"{self.prefix}.1"
        self.bridge_ns = f"qt{self.id}br"
        self.host_if = f"qt{self.id}h"
        self.nodes = [NSNode(i, f"qt{self.id}n{i}", f"node{i}", f"{self.prefix}.{11 + i}", base / f"n{i}")
                      for i in range(n)]
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []  # namespaces created so far, for a teardown after a half bring-up

    @staticmethod
    def _free_subnet() -> tuple[int, int]:
        used = sh("ip", "-4", "route").stdout.decode()
        for _ in range(100):
            a, b = random.randint(100, 250), random.randint(0, 250)
            if f"10.{a}.{b}." not in used:
                return a, b
        raise RuntimeError("no free 10.x.y.0/24 subnet")

    # ------------------------------------------------------------ up / down
    def up(self) -> "NetnsCluster":
        self.base.mkdir(parents=True, exist_ok=True)
        sh("ip", "netns", "add", self.bridge_ns)
        self._made.append(self.bridge_ns)
        self.br("ip", "link", "add", "br0", "type", "bridge")
        self.br("ip", "link", "set", "br0", "up")
        sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "hostport", "netns", self.bridge_ns)
        sh("ip", "addr", "add", f"{self.host_addr}/24", "dev", self.host_if)
        sh("ip", "link", "set", self.host_if, "up")
        self.br("ip", "link", "set", "hostport", "master", "br0", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.addr} {n.hostname}\n" for n in self.nodes)
        shadow = self._shadow()
        for n in self.nodes:
            n.dir.mkdir(parents=True, exist_ok=True)
            sh("ip", "netns", "add", n.netns)
            self._made.append(n.netns)
            sh("ip", "link", "add", f"qt{self.id}v{n.index}", "type", "veth", "peer", "name", "eth0",
               "netns", n.netns)
            sh("ip", "link", "set", f"qt{self.id}v{n.index}", "netns", self.bridge_ns)
            self.br("ip", "link", "set", f"qt{self.id}v{n.index}", "master", "br0", "up")
            self.ns(n.index, "ip", "addr", "add", f"{n.addr}/24", "dev", "eth0")
            self.ns(n.index, "ip", "link", "set", "eth0", "up")
            self.ns(n.index, "ip", "link", "set", "lo", "up")
            self._start_sshd(n, hosts, shadow)
        for n in self.nodes:
            self._wait_port(n.addr, 22)
        return self

    def _shadow(self) -> str:
        # The password goes to openssl on stdin, never on a command line or into a log.
        hashed = sh("openssl", "passwd", "-6", "-stdin", input=self.password.encode()).stdout.decode().strip()
        lines = []
        for line in Path("/etc/shadow").read_text().splitlines():
            parts = line.split(":")
            if parts[0] == self.user:
                parts[1] = hashed
            lines.append(":".join(parts))
        return "\n".join(lines) + "\n"

    def _passwd(self, home: Path) -> str:
        lines = []
        for line in Path("/etc/passwd").read_text().splitlines():
            parts = line.split(":")
            if parts[0] == self.user:
                parts[5] = str(home)
            lines.append(":".join(parts))
        return "\n".join(lines) + "\n"

    def _start_sshd(self, n: NSNode, hosts: str, shadow: str) -> None:
        d = n.dir
        (d / "etc").mkdir(parents=True, exist_ok=True)
        n.home.mkdir(mode=0o700, exist_ok=True)
        (d / "etc" / "passwd").write_text(self._passwd(n.home))
        key = d / "etc" / "ssh_host_ed25519_key"
        if not key.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", n.hostname, "-f", str(key))
        (d / "etc" / "hosts").write_text(hosts)
        sfile = d / "etc" / "shadow"
        sfile.write_text(shadow)
        os.chmod(sfile, 0o640)
        (d / "etc" / "sshd_config").write_text(f"""\
ListenAddress {n.addr}
Port 22
HostKey {key}
PidFile none
PermitRootLogin yes
PasswordAuthentication yes
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
StrictModes no
AuthorizedKeysFile .ssh/authorized_keys
Subsystem sftp /usr/lib/openssh/sftp-server
LogLevel ERROR
""")
        (d / "sshd.log").touch()
        script = (
            'set -e; hostname "$1"; '
            'mount --bind "$2/etc/passwd" /etc/passwd; mount --bind "$2/etc/hosts" /etc/hosts; '
            'mount --bind "$2/etc/shadow" /etc/shadow; mkdir -p /run/sshd; '
            'exec /usr/sbin/sshd -D -e -f "$2/etc/sshd_config" 2>>"$2/sshd.log"'
        )
        p = subprocess.Popen(["ip", "netns", "exec", n.netns, "unshare", "--uts", "--mount", "--pid", "--fork",
                              "--mount-proc", "sh", "-c", script, "sh", n.hostname, str(d)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        self._procs.append(p)

    def _wait_port(self, addr: str, port: int, bound: float = 10.0) -> None:
        import socket

        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            try:
                socket.create_connection((addr, port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd on {addr}:{port} did not come up within {bound:g}s")

    def down(self) -> None:
        """Kill everything in every node namespace, then remove the namespaces."""
        errors = []
        for n in self.nodes:
            if n.netns not in self._made:
                continue
            for pid in self.pids(n.index):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # already gone: that is what we want
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                errors.append(f"sshd wrapper {p.pid} did not exit")
        sh("ip", "link", "del", self.host_if, check=False)  # absent after a half bring-up
        for name in reversed(self._made):
            r = sh("ip", "netns", "del", name, check=False)
            if r.returncode != 0:
                errors.append(r.stderr.decode().strip())
        self._made.clear()
        if errors:
            raise RuntimeError("cluster teardown: " + "; ".join(errors))

    # ------------------------------------------------------------ helpers
    def br(self, *argv: str) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", self.bridge_ns, *argv)

    def ns(self, i: int, *argv: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
        """Run in node i's network namespace (not its mount namespace: host paths)."""
        return sh("ip", "netns", "exec", self.nodes[i].netns, *argv, check=check, timeout=timeout)

    def pids(self, i: int) -> list[int]:
        out = sh("ip", "netns", "pids", self.nodes[i].netns, check=False).stdout.decode().split()
        return [int(p) for p in out]

    def sshd_pids(self, i: int) -> set[int]:
        """The sshd wrapper chain of node i (unshare, the namespace's init sshd)."""
        keep = set()
        for pid in self.pids(i):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and (cmd[0].endswith(b"unshare") or cmd[0] == b"/usr/sbin/sshd" and b"-D" in cmd):
                keep.add(pid)
        return keep

    # The node's own daemons, besides sshd: SLURM's (support/slurm.py starts them, entered with nsenter, for the
    # rest of the session once a SLURM test ran) are the node's, not a run's leftovers.
    DAEMONS = (b"unshare", b"sshd", b"/usr/sbin/sshd", b"nsenter", b"slurmd", b"slurmctld", b": slurmscriptd")

    def job_pids(self, i: int) -> list[int]:
        """Processes in node i other than its daemons (sshd and its SSH sessions, SLURM's): what a run left
        behind."""
        out = []
        for pid in self.pids(i):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            if stat[stat.rfind(")") + 2] == "Z":
                continue
            if cmd.startswith(self.DAEMONS) or b"sftp-server" in cmd:
                continue
            out.append(pid)
        return out

    def host_key_line(self, i: int) -> str:
        n = self.nodes[i]
        kt, b64 = (n.dir / "etc" / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        return f"{n.addr} {kt} {b64}"

    def reset_firewall(self, i: int) -> None:
        self.ns(i, "iptables", "-F")
        self.ns(i, "iptables", "-P", "OUTPUT", "ACCEPT")
        self.ns(i, "iptables", "-P", "INPUT", "ACCEPT")

    def reset_shaping(self, i: int) -> None:
        self.ns(i, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)


def node_mount_ns_pid(cluster, i: int) -> int:
    """A process of node i that lives in the node's own mount namespace (its sshd)."""
    mine = os.readlink("/proc/self/ns/mnt")
    for pid in sorted(cluster.sshd_pids(i)) + sorted(set(cluster.pids(i))):  # the sshd listener outlives sessions
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") != mine:
                return pid
        except OSError:
            continue
    raise AssertionError(f"no process of node{i} in a mount namespace of its own")
