"""A real SLURM on the namespace cluster: Debian's slurm-wlm and munge, slurmctld on node 0 and one slurmd per
node, each inside its node's namespaces (network, hostname, mount: the node's /etc/passwd and /etc/hosts), CPU
only. What LAB-NOTES records about running it here holds: no cgroups (proctrack/linuxproc, task/none, a
cgroup.conf that skips the detection), a munged of its own (its own socket), every daemon bound to its node's
address, finished jobs kept an hour (no slurmdbd: scontrol and the completion log are the job's record).

Clients (sbatch, srun, squeue...) run on this machine, the "login node" at the bridge's host address, with
SLURM_CONF naming a client copy of slurm.conf (without NoInAddrAny: srun listens for its tasks on every
address). Everything lives in one world-readable directory, so that a login user's clients can read the
configuration and reach munge. `down()` cancels every job and leaves no daemon or job process behind.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from support.netns import sh

REQUIRED = ("slurmctld", "slurmd", "slurmstepd", "munged", "mungekey", "sbatch", "srun", "scontrol", "nsenter")
CTLD_PORT, SLURMD_PORT = 26817, 26818


def _sshd_pid(cluster, i: int) -> int:
    """Node i's sshd listener: the process whose namespaces (pid, mount, hostname, network) are the node's."""
    for pid in sorted(cluster.pids(i)):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(b"sshd: /usr/sbin/sshd -D") or cmd.startswith(b"/usr/sbin/sshd\0-D"):
            return pid
    raise RuntimeError(f"node{i} has no sshd listener to enter")


class Slurm:
    def __init__(self, cluster, cpus: int = 2):
        missing = [t for t in REQUIRED if shutil.which(t) is None and not Path("/usr/sbin", t).exists()]
        if missing:
            raise RuntimeError(f"SLURM needs {', '.join(missing)} (apt-get install slurmd slurmctld slurm-client "
                               "munge)")
        self.cluster = cluster
        self.cpus = cpus
        self.dir = Path(tempfile.mkdtemp(prefix="qt-slurm-"))
        os.chmod(self.dir, 0o755)
        self.conf = self.dir / "client.conf"
        self._procs: list[subprocess.Popen] = []

    @property
    def env(self) -> dict[str, str]:
        """What a client needs in its environment (beside PATH): the configuration to read."""
        return {"SLURM_CONF": str(self.conf)}

    def client(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=check,
                              env={**os.environ, **self.env})

    # ------------------------------------------------------------ up / down
    def up(self) -> "Slurm":
        d, c = self.dir, self.cluster
        self._munge()
        (d / "state").mkdir()
        for n in c.nodes:
            (d / "spool" / n.hostname).mkdir(parents=True)
        nodes = "\n".join(f"NodeName={n.hostname} NodeAddr={n.addr} CPUs={self.cpus} RealMemory=2000 State=UNKNOWN"
                          for n in c.nodes)
        conf = f"""\
ClusterName=qt
SlurmctldHost={c.nodes[0].hostname}({c.nodes[0].addr})
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d / 'munge' / 'munge.socket'}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.log
ReturnToService=1
MinJobAge=3600
MpiDefault=none
MailProg=/bin/true
SlurmctldTimeout=10
SlurmdTimeout=10
KillWait=5
SchedulerParameters=sched_interval=1
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        (d / "slurm.conf").write_text(conf + "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny\n")
        self.conf.write_text(conf)
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")  # skips 22.05's cgroup detection
        env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
        self._start(["slurmctld", "-D"], 0, env, "slurmctld.out")
        for n in c.nodes:
            self._start(["slurmd", "-D", "-N", n.hostname], n.index, env, f"slurmd.{n.hostname}.out")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = self.client("sinfo", "-h", "-o", "%t", check=False)
            if r.returncode == 0 and r.stdout.split() and all(s == "idle" for s in r.stdout.split()):
                return self
            time.sleep(0.2)
        raise RuntimeError(f"SLURM did not come up within 30 s: sinfo says {r.stdout.strip()!r} {r.stderr.strip()!r}; "
                           f"slurmctld log: {self.log_tail('slurmctld.log')}")

    def _munge(self) -> None:
        m, k = self.dir / "munge", self.dir / "mungekey"
        m.mkdir()
        k.mkdir(mode=0o700)
        sh("mungekey", "-c", "-k", str(k / "munge.key"))
        mu = pwd.getpwnam("munge")
        for p in (m, k, k / "munge.key"):
            os.chown(p, mu.pw_uid, mu.pw_gid)
        os.chmod(k / "munge.key", 0o400)
        os.chmod(m, 0o755)  # every user's clients reach the socket
        sh("runuser", "-u", "munge", "--", "munged", f"--socket={m / 'munge.socket'}", f"--key-file={k / 'munge.key'}",
           f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}")

    def _start(self, argv: list[str], node: int, env: dict, out: str) -> None:
        enter = ["nsenter", "-t", str(_sshd_pid(self.cluster, node)), "-n", "-u", "-m", "-p"]
        with open(self.dir / out, "wb") as f:
            self._procs.append(subprocess.Popen([*enter, *argv], env=env, stdin=subprocess.DEVNULL, stdout=f,
                                                stderr=subprocess.STDOUT, start_new_session=True))

    def wait_all_idle(self, bound: float = 60.0) -> None:
        """Until every node is IDLE (after a test set one DOWN and resumed it, or its jobs still end): the next
        test's request would otherwise be refused or pend."""
        deadline = time.monotonic() + bound
        states: list[str] = []
        while time.monotonic() < deadline:
            states = self.client("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split("\n")
            if all(line.split()[-1] == "idle" for line in states if line.strip()):
                return
            time.sleep(0.3)
        raise AssertionError(f"SLURM's nodes are not idle after {bound:g} s: {states}")

    def log_tail(self, name: str, n: int = 15) -> str:
        try:
            return "\n".join((self.dir / name).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(none)"

    def down(self) -> None:
        """Cancel every job, stop the daemons, their step daemons and munged; remove the directory."""
        jobs = self.client("squeue", "-h", "-o", "%i", check=False).stdout.split()
        if jobs:
            self.client("scancel", "--full", *jobs, check=False)
        for i in range(len(self.cluster.nodes)):
            for pid in self.cluster.pids(i):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if cmd.startswith((b"slurm", b"/usr/sbin/slurm", b"nsenter")) or b"slurmstepd" in cmd:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass  # ended meanwhile: that is what we want
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        pidfile = self.dir / "munge" / "munged.pid"
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass  # munged already gone
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------ faults and records
    def completion(self, job_id: str) -> str:
        """The job's line in SLURM's completion log ("" until it has ended)."""
        path = self.dir / "jobcomp.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        mine = [ln for ln in lines if ln.startswith(f"JobId={job_id} ")]
        return mine[-1] if mine else ""


def slurm_preset(field, name: str, *, nodes: int = 3, scheduler: dict | None = None,
                 monitor: dict | None = None, **training) -> Path:
    """A SLURM preset of the demo's shape (the tiny model, LoRA on CPU, a few steps) for the login user of
    `field` (support.field_run.FieldCluster): its nodes are SLURM's, its run directories and output on the
    storage every node shares."""
    from qwen_tui.preset.files import save_preset
    from qwen_tui.preset.schema import Preset

    work = field.shared / f"{name}-work"
    work.mkdir(exist_ok=True)
    os.chown(work, *_login_ids())
    out = field.shared / f"{name}-out"
    d = {
        "name": name,
        "scheduler": {"kind": "slurm", "nodes": nodes, "gpus_per_node": 1, "cpus_per_node": 1, "workdir": str(work),
                      "python": str(field.python), **(scheduler or {})},
        "cluster": {"shared_storage": True},
        "network": {"master_port": 29541, "backend": "gloo", "rdzv_timeout": 30, "interface": "eth0",
                    "env": {"OMP_NUM_THREADS": "1"}},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "method": "lora", "zero_stage": None,
                     "precision": "fp32", "device": "cpu", "max_steps": 6, "per_device_train_batch_size": 2,
                     "gradient_accumulation_steps": 1, "model_max_length": 64, "gradient_checkpointing": False,
                     "lora_r": 8, "save_strategy": "no", "logging_steps": 1, "output_dir": str(out), **training},
        "monitor": monitor or {},
    }
    path = field.shared / f"{name}.yaml"
    save_preset(Preset.model_validate(d), path)
    os.chown(path, *_login_ids())
    return path


def _login_ids() -> tuple[int, int]:
    from support.login_user import UID

    return UID, UID


def user_pids(cluster, uid: int) -> dict[int, list[int]]:
    """node -> the live processes of user `uid` in that node (what a run of that user left there). The node's
    SSH server sessions of that user are not a run's: a session whose client went while an earlier test cut the
    link (tests/cluster/test_field_faults.py) lives on, with its sftp-server, until TCP gives it up."""
    out: dict[int, list[int]] = {}
    for i in range(len(cluster.nodes)):
        for pid in cluster.pids(i):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"sshd:") or b"sftp-server" in cmd:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields.get("State", "").strip().startswith("Z"):
                continue
            if int(fields.get("Uid", "-1").split()[0]) == uid:
                out.setdefault(i, []).append(pid)
    return out
