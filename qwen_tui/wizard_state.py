"""What the wizard knows, in one place, owned by its App: the preset being edited, what
the checks learned, the open connections, and what each step still lacks. Plain data
and rules, no Textual (tested without a terminal); the screens under ui/ draw it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .advice import Advice, advise
from .estimate_report import Summary, summary
from .facts import ClusterFacts, NodeFacts
from .nodes.checks import consistency
from .nodes.findings import Finding
from .preset import Cluster, Network, Node, Preset, Training
from .run.api import Connections

STEPS = ("nodes", "ssh", "network", "training", "review", "run")
TITLES = {"nodes": "Nodes", "ssh": "SSH", "network": "Network", "training": "Training", "review": "Review", "run": "Run"}

# step status: "ok" (green), "todo" (not checked yet), "warn" (yellow), "bad" (red)
OK, TODO, WARN, BAD = "ok", "todo", "warn", "bad"


def new_preset() -> Preset:
    """What an empty wizard starts from: this machine as the only node, the tiny model."""
    return Preset(name="new-run", cluster=Cluster(nodes=[Node(host="localhost")]), network=Network(),
                  training=Training(model="builtin:tiny", data="builtin:demo-chat"))


@dataclass
class NodeStatus:
    probe: str = "not probed"  # "probing", "ok", "error: ..."
    ssh: str = "not connected"  # "connecting", "connected", "local", "error: ..."
    host_key: str = ""  # fingerprint or "changed (refused)"


@dataclass
class WizardState:
    preset: Preset
    path: Optional[Path] = None
    facts: ClusterFacts = field(default_factory=ClusterFacts)
    dirty: bool = False
    nodes: dict[int, NodeStatus] = field(default_factory=dict)
    advice: list[Advice] = field(default_factory=list)  # errors first (advise sorts them)
    estimate: Optional[Summary] = None
    findings: list[Finding] = field(default_factory=list)  # cross-node consistency
    net_findings: list[Finding] = field(default_factory=list)  # from the network checks
    key_report: Any = None
    net_checked: bool = False
    run_status: Optional[str] = None  # None, "running", "ok", "failed", "stopped"
    run_dir: Optional[Path] = None
    conns: Connections = field(default_factory=Connections)  # to the preset's nodes; workers connect through it

    def node(self, i: int) -> NodeStatus:
        return self.nodes.setdefault(i, NodeStatus())

    def node_facts(self, i: int) -> Optional[NodeFacts]:
        return self.facts.nodes.get(i)

    def recompute(self) -> None:
        """Advice, estimate and findings follow every change of preset or facts."""
        self.advice = list(advise(self.preset, self.facts))
        self.estimate = summary(self.preset, self.facts)
        self.findings = consistency(self.preset, self.facts) if self.facts.nodes else []

    # ---------------------------------------------------------------- step colours
    def step_status(self, step: str) -> str:
        p, n = self.preset, len(self.preset.cluster.nodes)
        if step == "nodes":
            st = [self.node(i).probe for i in range(n)]
            if any(s.startswith("error") for s in st):
                return BAD
            if any(f.level == "error" for f in self.findings):
                return BAD
            if self.findings:
                return WARN
            return OK if all(s == "ok" for s in st) else TODO
        if step == "ssh":
            if all(nd.is_local for nd in p.cluster.nodes):
                return OK
            st = [self.node(i).ssh for i in range(n)]
            if any(s.startswith("error") for s in st):
                return BAD
            if self.key_report is not None and not self.key_report.ok:
                return BAD
            return OK if all(s in ("connected", "local") for s in st) else TODO
        if step == "network":
            links = self.facts.links.values()
            if self.facts.master_port_free is False or any(lk.port_reachable is False or lk.firewall for lk in links):
                return BAD
            if any(f.level == "error" for f in self.net_findings):
                return BAD
            if any(lk.bandwidth_gbps is not None and lk.bandwidth_gbps < 10 for lk in links):
                return WARN
            return OK if self.net_checked or n == 1 else TODO
        if step == "training":
            levels = {a.level for a in self.advice}
            return BAD if "error" in levels else WARN if "warning" in levels else OK
        if step == "review":
            if any(self.step_status(s) == BAD for s in STEPS[:4]):
                return BAD
            return WARN if self.dirty else OK
        if step == "run":
            return {None: TODO, "starting": WARN, "running": WARN, "ok": OK, "stopped": WARN}.get(self.run_status, BAD)
        raise ValueError(step)
