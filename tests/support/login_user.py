"""A login user (not root) on every node of the namespace cluster, for tests that must
see what such a user sees: sshd's PATH for a non-root user (no sbin directories), no
privilege to read the firewall. The user goes into each node's own /etc/passwd and
/etc/shadow (bind-mounted copies: the host's files stay untouched); its home lives
outside the root-only pytest directories so that the user can read its own keys."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from qwen_tui.nodes.transport.ssh import SSHTarget, SSHTransport

LOGIN = "qtlogin"
UID = 4242


class LoginUser:
    def __init__(self, cluster, sshdir: Path):
        self.cluster, self.sshdir = cluster, sshdir
        self.root = Path(tempfile.mkdtemp(prefix=f"qt-{LOGIN}-"))
        os.chmod(self.root, 0o755)
        self._saved: dict[Path, str] = {}

    def add(self) -> "LoginUser":
        pub = (self.sshdir / "id_ed25519.pub").read_text()
        for n in self.cluster.nodes:
            home = self.root / f"n{n.index}"
            (home / ".ssh").mkdir(parents=True)
            (home / ".ssh" / "authorized_keys").write_text(pub)
            for d, _, files in os.walk(home):
                os.chown(d, UID, UID)
                for f in files:
                    os.chown(os.path.join(d, f), UID, UID)
            for name, line in (("passwd", f"{LOGIN}:x:{UID}:{UID}::{home}:/bin/sh"),
                               ("shadow", f"{LOGIN}:*:19000:0:99999:7:::")):
                f = n.dir / "etc" / name
                self._saved[f] = f.read_text()
                # write in place: the node sees this file through a bind mount of its inode
                with open(f, "a") as fh:
                    fh.write(line + "\n")
        return self

    def transport(self, i: int) -> SSHTransport:
        n = self.cluster.nodes[i]
        t = SSHTarget(label=n.hostname, hostname=n.addr, user=LOGIN,
                      identity_files=[str(self.sshdir / "id_ed25519")],
                      known_hosts=str(self.sshdir / "known_hosts"), connect_timeout=5, look_for_keys=False)
        return SSHTransport(t).connect()

    def remove(self) -> None:
        for f, text in self._saved.items():
            with open(f, "w") as fh:
                fh.write(text)
        shutil.rmtree(self.root, ignore_errors=True)
