"""What the wizard knows, in one place, owned by its App: the preset being edited, what
the checks learned, the open connections, and what each step still lacks. Plain data
and rules, no Textual (tested without a terminal); the screens under ui/ draw it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..advice.report import Summary, summary
from ..advice.rules import Advice, advise
from ..base.levels import Level
from ..base.strenum import StrEnum
from ..cluster.facts import ClusterFacts, NodeFacts
from ..nodes.checks.findings import Finding
from ..nodes.checks.runner import consistency
from ..preset.schema import Cluster, Network, Node, Preset, Training
from ..run.api import Connections
from ..run.states import RunState

if TYPE_CHECKING:  # paramiko, which keys needs, loads after the first paint
    from ..nodes.keys import KeySetupReport

STEPS = ("nodes", "ssh", "network", "training", "review", "run")
TITLES = {"nodes": "Nodes", "ssh": "SSH", "network": "Network", "training": "Training", "review": "Review", "run": "Run"}

# step status: "ok" (green), "todo" (not checked yet), "warn" (yellow), "bad" (red)
OK, TODO, WARN, BAD = "ok", "todo", "warn", "bad"
LIVE = "live"  # the Run step while a run starts or runs


def new_preset() -> Preset:
    """What an empty wizard starts from: this machine as the only node, the tiny model."""
    return Preset(name="new-run", cluster=Cluster(nodes=[Node(host="localhost")]), network=Network(),
                  training=Training(model="builtin:tiny", data="builtin:demo-chat"))


def step_of(path: str) -> str:
    """The step whose form edits this dotted preset path."""
    if path.startswith("network."):
        return "network"
    if path.startswith("cluster.nodes"):
        return "nodes"
    if path.startswith("cluster."):
        return "ssh"
    return "training"


def connection_fix(err: BaseException) -> str:
    """What to do about a node the wizard could not log into, in the wizard's own keys."""
    name = type(err).__name__
    if name == "UnknownHostKey":
        return "SSH step (F2): c connects and shows the fingerprint to accept"
    if name == "ChangedHostKey":
        return "find out why the node's host key changed before removing its old known_hosts entry"
    if name == "AuthFailed":
        return "SSH step (F2): k installs the key (asks the password once)"
    return "check the host name and port (F1, e) and that sshd runs on the node (ssh -v HOST)"


def finding_line(f: Advice | Finding, labels: list[str]) -> str:
    """`node 1 (gpu-b) CODE: message`: the node's number and host once (messages often start with the
    host already), or just `CODE: message` for the cluster as a whole."""
    mark = Level(f.level).mark
    msg = str(f.message)
    node = f.node
    if node is None or not 0 <= node < len(labels):
        return f"{mark} {f.code}: {msg}"
    label = labels[node]
    msg = msg.removeprefix(f"{label}: ")
    return f"{mark} node {node} ({label}) {f.code}: {msg}"


class ProbeState(StrEnum):
    """Where a node's probe is (the Nodes step's status column shows the word)."""

    NOT_PROBED = "not probed"
    CONNECTING = "connecting"
    PROBING = "probing"
    OK = "ok"
    ERROR = "error"  # NodeStatus.probe_error says what

    @property
    def busy(self) -> bool:
        return self in (ProbeState.CONNECTING, ProbeState.PROBING)


class SshState(StrEnum):
    """Where a node's SSH connection is (the SSH step's column shows the word)."""

    NOT_CONNECTED = "not connected"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    LOCAL = "local"
    KEY_INSTALLED = "key installed"
    ERROR = "error"  # NodeStatus.ssh_error says what
    REFUSED = "refused"  # the host key changed: the connection was refused, ssh_error says so

    @property
    def failed(self) -> bool:
        return self in (SshState.ERROR, SshState.REFUSED)


@dataclass
class NodeStatus:
    probe: ProbeState = ProbeState.NOT_PROBED
    probe_error: str = ""  # why, when probe is ERROR
    ssh: SshState = SshState.NOT_CONNECTED
    ssh_error: str = ""  # why, when ssh is ERROR or REFUSED
    host_key: str = ""  # fingerprint or "changed (refused)"
    fix: str = ""  # what to do about the last error (a connection's: connection_fix)

    def probe_failed(self, error: str) -> None:
        self.probe, self.probe_error = ProbeState.ERROR, error

    def probe_ok(self) -> None:
        self.probe, self.probe_error = ProbeState.OK, ""

    def ssh_failed(self, error: str, refused: bool = False) -> None:
        self.ssh, self.ssh_error = (SshState.REFUSED if refused else SshState.ERROR), error


@dataclass
class WizardState:
    preset: Preset
    path: Path | None = None
    facts: ClusterFacts = field(default_factory=ClusterFacts)
    dirty: bool = False
    nodes: dict[int, NodeStatus] = field(default_factory=dict)
    advice: list[Advice] = field(default_factory=list)  # errors first (advise sorts them)
    estimate: Summary | None = None
    findings: list[Finding] = field(default_factory=list)  # cross-node consistency
    net_findings: list[Finding] = field(default_factory=list)  # from the network checks
    key_report: KeySetupReport | None = None  # what k (install the key) and v (verify pairs) found
    net_checked: bool = False
    run_status: RunState | None = None  # None: no run here yet
    run_dir: Path | None = None
    conns: Connections = field(default_factory=Connections)  # to the preset's nodes; workers connect through it
    # values typed but not accepted (dotted path -> (text, why)): the preset keeps the old value meanwhile,
    # and the stepper and save say so, so a bad value never silently turns back into the old one
    field_errors: dict[str, tuple[Any, str]] = field(default_factory=dict)
    gpu: str | None = None  # the GPU type to assume where no probe says (the CLI's --gpu); not in the preset

    def forget_results(self) -> None:
        """Another preset was opened: what the checks learned (probe, SSH, network, keys) was about the
        one before, and must not be shown as this one's."""
        self.conns.close()
        self.nodes.clear()
        self.facts = ClusterFacts()
        self.findings, self.net_findings, self.net_checked, self.key_report = [], [], False, None
        self.field_errors.clear()  # what was typed was for the preset now closed

    def node(self, i: int) -> NodeStatus:
        return self.nodes.setdefault(i, NodeStatus())

    @property
    def gpu_unknown(self) -> bool:
        """A GPU run whose GPU memory nobody knows: neither a probe nor the GPU type select said."""
        est = self.estimate
        return est is not None and not est.cpu and est.memory_gib is not None and est.smallest_gpu_gib is None

    def node_facts(self, i: int) -> NodeFacts | None:
        return self.facts.nodes.get(i)

    def recompute(self) -> None:
        """Advice, estimate and findings follow every change of preset or facts."""
        self.advice = list(advise(self.preset, self.facts, gpu=self.gpu))
        self.estimate = summary(self.preset, self.facts, gpu=self.gpu)
        self.findings = consistency(self.preset, self.facts) if self.facts.nodes else []

    # ---------------------------------------------------------------- step colours
    def step_status(self, step: str) -> str:
        if any(step_of(path) == step for path in self.field_errors):
            return BAD
        p, n = self.preset, len(self.preset.cluster.nodes)
        if p.scheduler.is_slurm and step in ("nodes", "ssh", "network"):
            return OK  # SLURM gives the nodes, srun reaches them, and the job checks them before training
        if step == "nodes":
            st = [self.node(i).probe for i in range(n)]
            if ProbeState.ERROR in st:
                return BAD
            # the levels `qwen-tui check` gives the same findings: error red, warning yellow, info green
            if any(f.level == Level.ERROR for f in self.findings):
                return BAD
            if any(f.level == Level.WARNING for f in self.findings):
                return WARN
            return OK if all(s == ProbeState.OK for s in st) else TODO
        if step == "ssh":
            if all(nd.is_local for nd in p.cluster.nodes):
                return OK
            st = [self.node(i).ssh for i in range(n)]
            if SshState.ERROR in st:
                return BAD
            if self.key_report is not None and not self.key_report.ok:
                return BAD
            return OK if all(s in (SshState.CONNECTED, SshState.LOCAL) for s in st) else TODO
        if step == "network":
            links = self.facts.links.values()
            if self.facts.master_port_free is False or any(lk.port_reachable is False for lk in links):
                return BAD
            if any(f.level == Level.ERROR for f in self.net_findings):
                return BAD
            # firewall rules that drop or reject are a warning in `check` too (FIREWALL_RULES): they may not
            # touch the ports the run uses, which the port check decides
            if any(f.level == Level.WARNING for f in self.net_findings) or any(lk.firewall for lk in links):
                return WARN
            if any(lk.bandwidth_gbps is not None and lk.bandwidth_gbps < 10 for lk in links):
                return WARN
            return OK if self.net_checked or n == 1 else TODO
        if step == "training":
            levels = {a.level for a in self.advice}
            return BAD if Level.ERROR in levels else WARN if Level.WARNING in levels or self.gpu_unknown else OK
        if step == "review":  # the checks' real state: no ✔ before they ran
            before = [self.step_status(s) for s in STEPS[:4]]
            if BAD in before:
                return BAD
            if TODO in before:
                return TODO
            return WARN if self.dirty or WARN in before else OK
        if step == "run":
            # a healthy run is under way, not a warning: the stepper shows it with its own mark
            return {None: TODO, RunState.PENDING: LIVE, RunState.STARTING: LIVE, RunState.RUNNING: LIVE, RunState.OK: OK,
                    RunState.STOPPED: WARN}.get(self.run_status, BAD)
        raise ValueError(step)
