"""Podman on the namespace cluster's nodes, each node a machine of its own as far as podman can tell.

The worker image is built once (containers/build-image.sh, cached under the test cache and keyed by the wheel
and the recipe: a second session pays seconds) into an image store of its own, which every node reads as an
additional (read-only) image store, as nodes of a real cluster read one on shared storage. Each node gets its
own /etc/containers (a bind mount in the node's mount namespace, the host's stays untouched): its own storage
for containers (graphroot, run root), its own lock files and temporary directory, so that no node's podman
sees another node's containers (their pids belong to another PID namespace). This machine's podman needs two
settings LAB-NOTES records: runc, and no default ulimits (its root lacks CAP_SYS_RESOURCE, so a container
cannot be given limits above the host's hard ones: the tests' presets keep memlock at the node's limit).

`without_image(i)` and `without_podman(i)` take the image or the runtime away from one node for a while (its
storage reads no image store; an empty file over /usr/bin/podman), to see the checks name that node."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from support.netns import sh
from support.paths import ROOT

CACHE = Path(os.environ.get("QWEN_TUI_TEST_CACHE") or Path(tempfile.gettempdir()) / "qwen-tui-test-cache")
IMAGE_CACHE = CACHE / "image"
STORE = IMAGE_CACHE / "store"
TAG = "localhost/qwen-tui-worker:test"
BARE_TAG = "localhost/qwen-tui-bare:test"  # Debian's python3 and nothing of the worker's
BUILD_BOUND_S = 1200  # a first build on a cold pip cache: Debian's base, torch and the train extra

_CONTAINERS_CONF = """\
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
lock_type = "file"
tmp_dir = "{node}/tmp"
"""
_STORAGE_CONF = """\
[storage]
driver = "overlay"
graphroot = "{node}/storage"
runroot = "{node}/run"
[storage.options]
additionalimagestores = [{stores}]
"""


def build_image() -> str:
    """The worker image in the test store (built on first use, kept while the wheel and recipe stay the same)."""
    r = subprocess.run(["bash", str(ROOT / "containers" / "build-image.sh"), "--cache", str(IMAGE_CACHE),
                        "--store", str(STORE), "--tag", TAG, "--prune"],
                       capture_output=True, text=True, timeout=BUILD_BOUND_S,
                       env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    if r.returncode != 0:
        raise RuntimeError(f"containers/build-image.sh failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout.strip().splitlines()[-1]


def store_podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "--root", str(STORE), "--runroot", f"{STORE}.run", *args],
                          capture_output=True, text=True, timeout=timeout)


def build_bare_image() -> str:
    """An image with Debian's Python alone (the cached base root filesystem of build_image): one that lacks
    the worker."""
    if store_podman("image", "exists", BARE_TAG).returncode == 0:
        return BARE_TAG
    bases = sorted(IMAGE_CACHE.glob("base-*/done"), key=lambda p: p.stat().st_mtime)  # the newest last
    if not bases:
        raise RuntimeError(f"no Debian root filesystem under {IMAGE_CACHE}: build_image() first")
    rootfs = bases[-1].parent / "rootfs"
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", "-", "."], stdout=subprocess.PIPE)
    r = subprocess.run(["podman", "--root", str(STORE), "--runroot", f"{STORE}.run", "import", "-", BARE_TAG],
                       stdin=tar.stdout, capture_output=True, text=True, timeout=300)
    tar.stdout.close()
    tar.wait(timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"podman import of the bare image failed: {r.stderr[-2000:]}")
    return BARE_TAG


# Where podman (cgroupfs) puts every container's cgroup, and the CPU weight file of that parent: v1's cpu.shares
# (default 1024), v2's cpu.weight (default 100).
LIBPOD_PARENT = (("/sys/fs/cgroup/cpu/libpod_parent", "cpu.shares", 1024),
                 ("/sys/fs/cgroup/libpod_parent", "cpu.weight", 100))
# The nodes' containers together weigh as this many busy processes. Every container of the three "machines" sits
# under one parent cgroup, which the CPU scheduler weighs as one process against each process outside cgroups: with
# the rest of the suite busy beside them, the containers' ranks ran 5x slower than alone (each node is a machine
# of its own in what the tests mean). A scheduling weight only: what runs and what is asserted are unchanged.
CONTAINER_WEIGHT = 6


def weigh_containers(weight: int) -> tuple[Path, str] | None:
    """Gives podman's parent cgroup the CPU weight of `weight` processes; its earlier value, to restore (None where
    this machine has no such CPU controller: nothing to weigh)."""
    for parent, name, one in LIBPOD_PARENT:
        ctl = Path(parent).parent
        if not (ctl / name).exists() and not (ctl / "cgroup.subtree_control").exists():
            continue
        Path(parent).mkdir(exist_ok=True)  # podman takes it as it finds it
        f = Path(parent) / name
        if f.exists():
            before = f.read_text().strip()
            f.write_text(str(one * weight))
            return f, before
    return None


class PodmanNodes:
    def __init__(self, cluster, base: Path):
        self.cluster = cluster
        self.base = base
        self._mounted: list[tuple[int, str]] = []
        self._weight: tuple[Path, str] | None = None

    def node_dir(self, i: int) -> Path:
        return self.base / f"podman-n{i}"

    def _write(self, i: int, with_store: bool) -> Path:
        d = self.node_dir(i)
        etc = d / ("etc" if with_store else "etc-no-store")
        etc.mkdir(parents=True, exist_ok=True)
        (d / "tmp").mkdir(exist_ok=True)
        for name in ("policy.json", "registries.conf"):
            shutil.copy(f"/etc/containers/{name}", etc / name)
        (etc / "containers.conf").write_text(_CONTAINERS_CONF.format(node=d))
        stores = f'"{STORE}"' if with_store else ""
        (etc / "storage.conf").write_text(_STORAGE_CONF.format(node=d, stores=stores))
        return etc

    def _in_node(self, i: int, *argv: str) -> None:
        # the node's mount and PID namespaces: its /proc is its PID namespace's, which mount and umount read
        sh("nsenter", "-t", str(self.init_pid(i)), "-m", "-p", *argv)

    def _mount(self, i: int, src: str, target: str) -> None:
        self._in_node(i, "mount", "--bind", src, target)
        self._mounted.append((i, target))

    def _umount(self, i: int, target: str) -> None:
        self._in_node(i, "umount", target)
        self._mounted.remove((i, target))

    def _mount_cgroups(self, i: int) -> None:
        """The node's /sys is the fresh sysfs `ip netns exec` mounts, without this machine's cgroup hierarchies,
        which runc needs for a container's cgroup: mount them there as a node has them (the same hierarchies)."""
        script = ["mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup"]
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            sep = fields.index("-")
            point, fstype, opts = fields[4], fields[sep + 1], fields[sep + 3]
            if fstype in ("cgroup", "cgroup2") and point.startswith("/sys/fs/cgroup/"):
                script.append(f"mkdir -p {point} && mount -t {fstype} -o {opts} cgroup {point}")
        self._in_node(i, "sh", "-ec", "; ".join(script))
        self._mounted.append((i, "-R /sys/fs/cgroup"))

    def up(self) -> "PodmanNodes":
        self._weight = weigh_containers(CONTAINER_WEIGHT)
        for n in self.cluster.nodes:
            self._mount_cgroups(n.index)
            self._write(n.index, with_store=False)
            self._mount(n.index, str(self._write(n.index, with_store=True)), "/etc/containers")
        return self

    def init_pid(self, i: int) -> int:
        """Node i's sshd listener: process 1 of the node's PID namespace (node_mount_ns_pid may give the unshare
        above it, in the node's mount namespace but not in its PID namespace, or a container's process)."""
        for pid in self.cluster.pids(i):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
            if len(nspid) >= 2 and nspid[-1] == "1":
                return pid
        raise AssertionError(f"no process 1 in node{i}'s PID namespace")

    def podman(self, i: int, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """podman as node i runs it (its mount, network, UTS and PID namespaces: its sshd's)."""
        pid = str(self.init_pid(i))
        return subprocess.run(["nsenter", "-t", pid, "-m", "-n", "-u", "-p", "podman", *args],
                              capture_output=True, text=True, timeout=timeout)

    def containers(self, i: int) -> list[str]:
        """Every container node i's podman knows, running or not."""
        r = self.podman(i, "ps", "-a", "--format", "{{.Names}}")
        if r.returncode != 0:
            raise RuntimeError(f"podman ps on node{i}: {r.stderr.strip()}")
        return r.stdout.split()

    @contextlib.contextmanager
    def without_image(self, i: int):
        """Node i's storage reads no image store for a while: the worker image is not there."""
        self._mount(i, str(self.node_dir(i) / "etc-no-store" / "storage.conf"), "/etc/containers/storage.conf")
        try:
            yield
        finally:
            self._umount(i, "/etc/containers/storage.conf")

    @contextlib.contextmanager
    def without_podman(self, i: int):
        """No podman on node i's PATH for a while (an empty, non-executable file over it)."""
        empty = self.node_dir(i) / "no-podman"
        empty.write_text("")
        empty.chmod(0o644)
        self._mount(i, str(empty), shutil.which("podman") or "/usr/bin/podman")
        try:
            yield
        finally:
            self._umount(i, shutil.which("podman") or "/usr/bin/podman")

    def down(self) -> None:
        errors = []
        for i, target in list(reversed(self._mounted)):
            try:
                if target.startswith("-R "):
                    self._in_node(i, "umount", "-R", target[3:])
                    self._mounted.remove((i, target))
                else:
                    self._umount(i, target)
            except RuntimeError as e:  # the node may be gone already; the cluster's teardown reports that
                errors.append(str(e))
        for n in self.cluster.nodes:
            shutil.rmtree(self.node_dir(n.index), ignore_errors=True)
        if self._weight:
            f, before = self._weight
            f.write_text(before)
            self._weight = None
        if errors:
            raise RuntimeError("podman nodes teardown: " + "; ".join(errors))


if __name__ == "__main__":  # .ci/run builds it before the tests: PYTHONPATH=tests python -m support.podman_nodes
    print(build_image())
