"""The wizard's one door into the core. No Textual here: every function is plain
data in, plain data out, so it is tested without a terminal.

It holds no rules of its own. It (1) applies dotted-path edits to a Preset through
pydantic, (2) calls the advice, estimate, probe, network and key modules, and
(3) adapts where those modules are optional or still landing: a missing module
becomes an "unavailable" answer the screen shows, never an ImportError.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass, field
from typing import Any, Optional

from pydantic import ValidationError

from ..facts import ClusterFacts, NodeFacts
from ..preset import Preset, PresetError


def _optional(name: str):
    """Import a core module that may not have landed yet; None when it is absent."""
    try:
        return importlib.import_module(f"qwen_tui.{name}")
    except ImportError as e:
        if e.name != f"qwen_tui.{name}":
            raise  # the module exists but is broken: that is a bug to see, not to hide
        return None


# ------------------------------------------------------------------ editing the preset

@dataclass
class FieldError:
    path: str  # dotted, e.g. "training.learning_rate"
    message: str


def with_changes(preset: Preset, changes: dict[str, Any]) -> Preset:
    """A new Preset with `changes` ({"training.zero_stage": 3, "cluster.nodes": [...]}) applied.

    Raises PresetError whose `field_errors` name the dotted path of each problem, so the
    screen can show it next to its input.

    Fields the preset leaves at their defaults stay unset (exclude_unset): a local node's `python` that the
    preset never gave must stay unset, or the plan gives it "python3" instead of qwen-tui's own interpreter."""
    data = preset.model_dump(mode="python", exclude_unset=True)
    for path, value in changes.items():
        cur = data
        parts = path.split(".")
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur.setdefault(p, {})
        last = parts[-1]
        if isinstance(cur, list):
            cur[int(last)] = value
        else:
            cur[last] = copy.deepcopy(value)
    try:
        return Preset.model_validate(data)
    except ValidationError as e:
        errs = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if not loc and ": " in msg:  # model-level validators carry the path in the message
                loc, _, msg = msg.partition(": ")
            errs.append(FieldError(loc, msg))
        pe = PresetError([f"{fe.path}: {fe.message}" for fe in errs])
        pe.field_errors = errs  # type: ignore[attr-defined]
        raise pe from None


# ------------------------------------------------------------------ advice and estimates

@dataclass
class AdviceItem:
    """What the advice list shows. `fix` is the advice module's own Fix object (or None)."""

    level: str
    code: str
    message: str
    fix: Any = None
    raw: Any = None

    @property
    def fix_label(self) -> str:
        if self.fix is None:
            return ""
        return str(getattr(self.fix, "label", self.fix))


def advice(preset: Preset, facts: ClusterFacts) -> list[AdviceItem]:
    mod = _optional("advice")
    if mod is None:
        return []
    out = []
    for a in mod.advise(preset, facts):
        out.append(AdviceItem(level=str(getattr(a, "level", "info")), code=str(getattr(a, "code", "")),
                              message=str(getattr(a, "message", a)), fix=getattr(a, "fix", None), raw=a))
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(out, key=lambda a: order.get(a.level, 3))


def apply_fix(preset: Preset, item: AdviceItem) -> Preset:
    """Apply an advice item's fix through the advice module (it owns what a fix means)."""
    mod = _optional("advice")
    fix = item.fix
    if fix is None:
        raise ValueError(f"{item.code}: this finding has no automatic fix")
    if mod is not None and hasattr(mod, "apply_fix"):
        return mod.apply_fix(preset, fix)
    return with_changes(preset, dict(getattr(fix, "changes", {})))


@dataclass
class Estimate:
    """The live panel's numbers; None where the estimator could not say."""

    effective_batch: int = 0
    batch_formula: str = ""
    memory_gib: Optional[float] = None
    smallest_gpu_gib: Optional[float] = None
    memory_note: str = ""
    step_seconds: Optional[float] = None
    tokens_per_s: Optional[float] = None
    scaling: Optional[float] = None
    notes: list[str] = field(default_factory=list)


def _batch_formula(preset: Preset) -> str:
    # the plan owns the wording; building a throwaway plan keeps one formula everywhere
    from ..plan import make_plan

    return make_plan(preset, run_id="preview", local_run_dir="/nonexistent").batch_formula


def _num(obj: Any, *names: str) -> Optional[float]:
    for n in names:
        v = obj.get(n) if isinstance(obj, dict) else getattr(obj, n, None)
        if isinstance(v, (int, float)):
            return float(v)
    return None


def estimate(preset: Preset, facts: ClusterFacts) -> Estimate:
    """The estimator's report (the same plain data `qwen-tui estimate --json` prints)."""
    import os

    est = Estimate(effective_batch=preset.effective_batch_size, batch_formula=_batch_formula(preset))
    mod = _optional("cli_estimate")
    if mod is None:
        est.notes.append("estimates unavailable (qwen_tui.estimate not installed)")
        return est
    r = mod.build_report(preset, facts, base_dir=os.getcwd())
    est.smallest_gpu_gib = (r.get("gpu") or {}).get("memory_gib")
    if r.get("error"):
        est.notes.append(str(r["error"]))
        return est
    mem = r.get("gpu_memory_gb") or {}
    est.memory_gib = mem.get("total")
    est.memory_note = str(mem.get("phase") or "")
    est.step_seconds = r.get("step_time_s")
    est.tokens_per_s = r.get("tokens_per_second")
    points = r.get("scaling_efficiency") or []
    here = next((p for p in points if p.get("nodes") == len(preset.cluster.nodes)), None)
    if here is not None:
        est.scaling = here.get("scaling_efficiency")
    if preset.training.device == "cpu":
        est.notes.append("device cpu: GPU memory and speed figures do not apply")
    return est


# ------------------------------------------------------------------ node checks

def probe_node(preset: Preset, index: int, transport) -> NodeFacts:
    """Probe one node through the infra module; a NodeFacts with `error` when it cannot."""
    mod = _optional("nodes.probe")
    if mod is None:
        return NodeFacts(error="probe unavailable (qwen_tui.nodes.probe not installed)")
    out = mod.probe_node(transport, preset, index)
    return out[0] if isinstance(out, tuple) else out  # (facts, raw JSON)


@dataclass
class Finding:
    level: str
    code: str
    message: str
    fix: str = ""
    node: Optional[int] = None
    check: str = ""


def _finding(f: Any) -> Finding:
    return Finding(level=str(getattr(f, "level", "warning")), code=str(getattr(f, "code", "")),
                   message=str(getattr(f, "message", f)), fix=str(getattr(f, "fix", "") or ""),
                   node=getattr(f, "node", None), check=str(getattr(f, "check", "")))


def consistency(preset: Preset, facts: ClusterFacts) -> list[Finding]:
    """Cross-node findings (GPU models, versions, data checksums), pure."""
    mod = _optional("nodes.checks")
    if mod is None or not facts.nodes:
        return []
    return [_finding(f) for f in mod.consistency(preset, facts)]


def node_checks(preset: Preset, transports: dict) -> tuple[ClusterFacts, list[Finding]]:
    """Every node check in one pass (probe, ports, firewall, iperf3): what `qwen-tui check` runs."""
    mod = _optional("nodes.checks")
    if mod is None:
        raise RuntimeError("node checks unavailable (qwen_tui.nodes.checks not installed)")
    rep = mod.run_checks(preset, transports)
    return rep.facts, [_finding(f) for f in rep.findings]


def sync_from_master(preset: Preset, transports: dict, facts: ClusterFacts, *,
                     overwrite: bool = False) -> tuple[list[str], int]:
    """The checksum-verified copy `qwen-tui check --sync` runs: data, model and training code from the
    master to the nodes that lack them (or, with `overwrite`, whose copy differs). Nodes not probed yet
    are probed first. Returns one line per node and kind, and how many copies differ and were left."""
    from qwen_tui.nodes.sync import sync

    facts = ClusterFacts(nodes=dict(facts.nodes))
    for i in sorted(transports):
        if i not in facts.nodes or facts.nodes[i].error:
            facts.nodes[i] = probe_node(preset, i, transports[i])
    res = sync(preset, transports, facts, overwrite=overwrite)
    lines, differ = [], 0
    for i, acts in sorted(res.items()):
        lab = preset.cluster.nodes[i].label
        if isinstance(acts, BaseException):
            lines.append(f"{lab}: {acts}")
            continue
        for a in acts:
            lines.append(f"{lab} {a.kind}: {a.action}" + (f" ({a.detail})" if a.detail else ""))
            differ += a.action.startswith("differs")
    return lines, differ


def network_checks() -> dict[str, tuple[str, ...]]:
    """The network checks that can be run on their own: name -> the finding columns it owns."""
    mod = _optional("nodes.checks")
    return dict(getattr(mod, "NETWORK_CHECKS", {})) if mod is not None else {}


def network_check(preset: Preset, transports: dict, which: str,
                  facts: ClusterFacts) -> tuple[ClusterFacts, list[Finding]]:
    """One network check again (ports, firewall or bandwidth), the same function
    `qwen-tui check` runs; facts come back with only that check's fields new."""
    mod = _optional("nodes.checks")
    if mod is None:
        raise RuntimeError("node checks unavailable (qwen_tui.nodes.checks not installed)")
    out, findings = mod.run_network_check(preset, transports, which, facts)
    return out, [_finding(f) for f in findings]


def replace_findings(old: list[Finding], new: list[Finding], which: str) -> list[Finding]:
    """The findings after check `which` ran again: its columns' old findings go, its new ones come."""
    cols = set(network_checks().get(which, ())) | {f.check for f in new if f.check}
    return [f for f in old if f.check not in cols] + list(new)


def ssh_config_import_text(path: str) -> str:
    """An ssh_config's text for the host import, its Includes expanded (ValueError when unreadable)."""
    from qwen_tui.nodes.sshconfig import import_text
    from qwen_tui.nodes.transport import TransportError

    try:
        return import_text(path)
    except TransportError as e:
        raise ValueError(str(e)) from None


def import_nodes(kind: str, text: str) -> list[dict[str, Any]]:
    from . import hostlists

    return hostlists.parse(kind, text)


def run_checks(preset: Preset, transports: dict) -> tuple[ClusterFacts, list[AdviceItem]]:
    """The launch checks `replay` runs (port, probe, network, firewall, iperf3): the
    same function, so the wizard and replay agree on what is wrong."""
    from ..run.session import run_checks as session_checks

    facts, adv, _report = session_checks(preset, transports, None)
    # node-check findings carry their fix as text (a command to run), not a preset change
    items = [AdviceItem(level=str(a.level), code=str(a.code),
                        message=str(a.message) + (f" (fix: {a.fix})" if isinstance(a.fix, str) and a.fix else ""),
                        fix=None if isinstance(a.fix, str) else a.fix, raw=a)
             for a in adv]
    return facts, items


def merge_facts(old: ClusterFacts, new: ClusterFacts) -> ClusterFacts:
    """Keep what `old` knew where `new` did not look (e.g. probe results across a port check)."""
    out = ClusterFacts.from_dict(old.to_dict())
    out.nodes.update(new.nodes)
    out.links.update(new.links)
    for k in ("master_port_free", "shared_storage", "rehearsal_ok", "rehearsal_bandwidth_gbps"):
        v = getattr(new, k)
        if v is not None:
            setattr(out, k, v)
    return out


def get_path(preset: Preset, path: str) -> Any:
    cur: Any = preset
    for p in path.split("."):
        cur = cur[int(p)] if isinstance(cur, list) else getattr(cur, p)
    return cur
