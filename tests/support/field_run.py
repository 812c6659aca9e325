"""A run on the namespace cluster the way a user starts one: `qwen-tui replay` as a login user (not root),
every node, the master too, reached over SSH as that user, with faults injected from outside the way the
field brings them: SSH cut on one node (port 22 only; training traffic untouched), a rank stopped, a
node's CPU throttled. Shared by tests/cluster/test_field_*.py and bench/chaos_soak.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from qwen_tui.preset.files import save_preset
from qwen_tui.preset.schema import Preset
from support import login_runtime
from support.login_user import LOGIN, UID, LoginUser


def _own(path: Path) -> None:
    os.chown(path, UID, UID)


class FieldCluster:
    """The login user's side of the cluster: its ssh files, a workdir per node, a shared output area."""

    def __init__(self, cluster, sshdir: Path):
        self.cluster = cluster
        self.user = LoginUser(cluster, sshdir).add()
        self.root = self.user.root
        # the Python the user runs qwen-tui and the nodes' workers with: its own, under its reach, whatever the
        # reach of this checkout and its environment (a clone in root's home is out of it)
        self.python = login_runtime.build(self.root / "runtime", UID)
        self.home = self.root / "host"  # the login user's home on the machine qwen-tui runs on
        ssh = self.home / ".ssh"
        ssh.mkdir(parents=True)
        shutil.copy(sshdir / "id_ed25519", ssh / "id_ed25519")
        shutil.copy(sshdir / "known_hosts", ssh / "known_hosts")
        lines = []
        for n in cluster.nodes:
            lines += [f"Host {n.hostname}", f"    HostName {n.addr}", f"    User {LOGIN}",
                      f"    IdentityFile {ssh / 'id_ed25519'}", "    ConnectTimeout 5", ""]
        (ssh / "config").write_text("\n".join(lines))
        self.shared = self.root / "shared"  # one directory every node sees (the namespaces share this disk)
        self.shared.mkdir()
        for d in (self.home, ssh, ssh / "id_ed25519", ssh / "known_hosts", ssh / "config", self.shared):
            _own(d)
        os.chmod(ssh / "id_ed25519", 0o600)
        for n in cluster.nodes:
            w = self.workdir(n.index)
            w.mkdir(parents=True)
            _own(w)

    def workdir(self, i: int) -> Path:
        return self.root / f"n{i}" / "work"

    def preset(self, name: str, monitor: dict | None = None, env: dict | None = None, **training) -> Path:
        """A preset for every node over SSH as the login user; written where that user can read it. env: more
        of network.env (every rank's environment)."""
        c = self.cluster
        out = self.shared / name
        d = {
            "name": name,
            "cluster": {
                "nodes": [{"host": n.hostname, "gpus": 1, "workdir": str(self.workdir(n.index)),
                           "python": str(self.python)} for n in c.nodes],
                "ssh_config": str(self.home / ".ssh" / "config"),
                "known_hosts": str(self.home / ".ssh" / "known_hosts"),
                "connect_timeout": 5,
                "shared_storage": True,
            },
            "network": {"master_addr": c.nodes[0].addr, "master_port": 29500, "backend": "gloo",
                        "rdzv_timeout": 30, "interface": "eth0",
                        "env": {"OMP_NUM_THREADS": "1", **(env or {})}},  # three CPU "nodes" share two cores
            "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "method": "lora",
                         "zero_stage": None, "precision": "fp32", "device": "cpu",
                         "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1,
                         "model_max_length": 64, "gradient_checkpointing": False, "lora_r": 8,
                         "save_strategy": "no", "logging_steps": 1, "output_dir": str(out), **training},
            "monitor": monitor or {},
        }
        path = self.shared / f"{name}.yaml"
        save_preset(Preset.model_validate(d), path)
        _own(path)
        return path

    def replay(self, preset: Path, log: Path, *extra: str, env: dict | None = None,
               prefix: tuple[str, ...] = ()) -> "Replay":
        """`qwen-tui replay PRESET EXTRA...` as the login user; `env`: more of its environment (SLURM's client
        configuration, say); `prefix`: a command it runs under (salloc ...)."""
        return Replay(self, preset, log, ["replay", str(preset), *extra], runs=self.home / f"runs-{preset.stem}",
                      env=env, prefix=prefix)

    def qwen_tui(self, log: Path, *argv: str, runs: Path | None = None, bound: float = 120.0,
                 env: dict | None = None) -> str:
        """Another qwen-tui command as the login user, run to its end: what it printed."""
        rp = Replay(self, None, log, list(argv), runs=runs or self.home / "runs", env=env)
        try:
            rp.finish(bound)
            return rp.text()
        finally:
            rp.close()

    def live_metrics(self, run_id: str) -> Path:
        """The worker's own metrics file on node 0 (replay's copy lags behind it)."""
        return self.workdir(0) / ".qwen-tui" / "runs" / run_id / "metrics.jsonl"

    def rank_pids(self, i: int) -> list[int]:
        """Node i's training processes (the ranks; not its job shell or torchrun agent)."""
        out = []
        for pid in self.cluster.job_pids(i):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"training.finetune" in cmd and b"torch.distributed.run" not in cmd:
                out.append(pid)
        return out

    def cut_ssh(self, i: int) -> None:
        """Drop every packet to node i's sshd: SSH hangs as over a dead link; gloo's ports stay open."""
        self.cluster.ns(i, "iptables", "-I", "INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP")

    def mend_ssh(self, i: int) -> None:
        self.cluster.ns(i, "iptables", "-D", "INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP", check=False)

    def vanish(self, i: int, how: str) -> list[int]:
        """Node i goes as a machine does. "reset": as a crashed or rebooted machine, its processes gone (SIGKILL)
        and its kernel answering every TCP segment with a reset, SSH included (nothing else leaves it, not even
        the FIN of a closing socket). "silent": every packet in and out dropped and its processes frozen
        (SIGSTOP), as a machine whose network is gone or that hangs whole. Returns the frozen pids (mend them)."""
        if how == "reset":
            self.cluster.ns(i, "iptables", "-I", "OUTPUT", "-p", "tcp", "!", "--tcp-flags", "RST", "RST",
                            "-j", "DROP")
            self.cluster.ns(i, "iptables", "-I", "INPUT", "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset")
            sig = signal.SIGKILL
        elif how == "silent":
            self.cluster.ns(i, "iptables", "-I", "OUTPUT", "-j", "DROP")
            self.cluster.ns(i, "iptables", "-I", "INPUT", "-j", "DROP")
            sig = signal.SIGSTOP
        else:
            raise ValueError(f"vanish: how is reset or silent, not {how!r}")
        pids = self.cluster.job_pids(i)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
        return pids if how == "silent" else []

    def mend(self, i: int, frozen: list[int]) -> None:
        """After vanish: what was frozen is killed (the machine's processes do not come back), the network is back."""
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        self.cluster.reset_firewall(i)

    def close(self) -> None:
        for n in self.cluster.nodes:
            self.mend_ssh(n.index)
        self.user.remove()


class Replay:
    """`qwen-tui replay` (or another command: argv) as the login user, in a process group of its own."""

    def __init__(self, field: FieldCluster, preset: Path | None, log: Path, argv: list[str], runs: Path,
                 env: dict | None = None, prefix: tuple[str, ...] = ()):
        self.field, self.log = field, log
        self.runs = runs  # each replay finds its own run directory, no other
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(field.home), "USER": LOGIN,
               "LOGNAME": LOGIN, "COLUMNS": "200", "PYTHONUNBUFFERED": "1",
               "QWEN_TUI_RUNS": str(self.runs), **(env or {})}
        # The user exists on this machine too, for OpenSSH (ssh -G reads the config as a known user): in copies
        # of passwd and group bind-mounted in a mount namespace of replay's own; the host's files stay as they are.
        etc = field.root / "etc"
        if not etc.is_dir():
            etc.mkdir()
            (etc / "passwd").write_text(open("/etc/passwd").read() + f"{LOGIN}:x:{UID}:{UID}::{field.home}:/bin/sh\n")
            (etc / "group").write_text(open("/etc/group").read() + f"{LOGIN}:x:{UID}:\n")
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$1" /etc/passwd && mount --bind "$2" /etc/group && shift 2 && exec "$@"', "sh",
                str(etc / "passwd"), str(etc / "group"),
                "setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", *prefix, str(field.python), "-m",
                "qwen_tui.cli", *argv]
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, env=env,
                                     cwd=str(field.home), start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, what: str, cond, bound: float, every: float = 0.05):
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            got = cond()
            if got:
                return got
            if self.proc.poll() is not None:
                raise AssertionError(f"replay ended (rc {self.proc.returncode}) before {what}:\n{self.text()[-4000:]}")
            time.sleep(every)
        raise AssertionError(f"no {what} within {bound:g}s:\n{self.text()[-4000:]}")

    def run_dir(self, bound: float = 60.0) -> Path:
        return self.wait_for("run directory", lambda: next(iter(self.runs.glob("*/plan.json")), None),
                             bound).parent

    def step(self, run_id: str) -> int:
        """The last step the worker itself recorded."""
        return max((r["step"] for r in records(self.field.live_metrics(run_id)) if "loss" in r and "event" not in r),
                   default=0)

    def wait_step(self, run_id: str, n: int, bound: float = 300.0) -> int:
        return self.wait_for(f"step {n}", lambda: (s := self.step(run_id)) >= n and s, bound, every=0.01)

    def finish(self, bound: float = 300.0) -> int:
        try:
            return self.proc.wait(bound)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"replay still running after {bound:g}s:\n{self.text()[-4000:]}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


def records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(r, dict):
            out.append(r)
    return out


def steps_of(path: Path) -> list[int]:
    return [r["step"] for r in records(path) if "loss" in r and "event" not in r]


def no_job_left(cluster, bound: float = 30.0) -> dict[int, list[int]]:
    """{} once no node runs anything of a run; else what is still there at the bound."""
    deadline = time.monotonic() + bound
    left: dict[int, list[int]] = {}
    while time.monotonic() < deadline:
        left = {i: p for i in range(len(cluster.nodes)) if (p := cluster.job_pids(i))}
        if not left:
            return {}
        time.sleep(0.3)
    return left


class CpuThrottle:
    """A cgroup that caps its processes at `percent` of one CPU (cgroup v2 cpu.max, else v1's CFS quota)."""

    def __init__(self, name: str, percent: int):
        v2 = Path("/sys/fs/cgroup")
        controllers = (v2 / "cgroup.controllers").read_text().split() if (v2 / "cgroup.controllers").exists() else []
        if "cpu" in controllers:
            self.dir = v2 / name
            self.dir.mkdir()
            (self.dir / "cpu.max").write_text(f"{percent * 1000} 100000")
        else:
            base = Path("/sys/fs/cgroup/cpu")
            if not (base / "cpu.cfs_quota_us").exists():
                raise RuntimeError("no cgroup CPU controller (neither cgroup v2 cpu.max nor v1 cpu) on this machine")
            self.dir = base / name
            self.dir.mkdir()
            (self.dir / "cpu.cfs_period_us").write_text("100000")
            (self.dir / "cpu.cfs_quota_us").write_text(str(percent * 1000))

    def add(self, pid: int) -> None:
        (self.dir / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        parent = self.dir.parent / "cgroup.procs"
        for pid in (self.dir / "cgroup.procs").read_text().split():
            try:
                parent.write_text(pid)
            except OSError:
                continue  # the process ended meanwhile
        self.dir.rmdir()
