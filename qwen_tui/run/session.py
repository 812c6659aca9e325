"""The headless flow shared by `replay`, `demo` and `attach`: checks, plan, launch,
follow. The wizard runs the same steps one screen at a time."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..facts import ClusterFacts
from ..nodes.transport import LocalTransport, Transport
from ..plan import LaunchPlan, make_plan
from ..preset import Preset, load_preset, save_preset
from ..redact import printable, shown_env
from .launcher import LaunchError, Launcher
from .rundir import RunDir, RunDirError, default_runs_root, new_run_id, write_json_atomic


def local_port_free(port: int, host: str = "") -> Optional[str]:
    """None when a listener could bind `port` here, else why not."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # as torch's TCPStore does: connections of an earlier run in TIME_WAIT must not count as busy
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        return f"port {port} is in use on this machine ({e.strerror})"
    finally:
        s.close()
    return None


def connect(preset: Preset, *, accept_new_host_keys: bool) -> dict[int, Transport | Exception]:
    """A transport per node index; local nodes need no connection."""
    if all(n.is_local for n in preset.cluster.nodes):
        return {i: LocalTransport(n.label) for i, n in enumerate(preset.cluster.nodes)}
    from ..nodes.connect import connect_all

    return connect_all(preset, accept_new_host_keys=accept_new_host_keys)


def print_plan(plan: LaunchPlan, console: Console) -> None:
    console.print(f"[bold]plan {plan.run_id}[/]: {plan.nnodes} nodes, world size {plan.world_size}, "
                  f"backend {plan.backend}, master {plan.master_addr}:{plan.master_port}")
    console.print(f"effective batch size: {plan.batch_formula}")
    for c in plan.nodes:
        console.rule(escape(f"node {c.rank}: {c.label}" + (" (local)" if c.local else "")))
        for k, v in shown_env(c.env).items():  # secrets as ***, control characters escaped
            console.print(f"  {k}={v}", markup=False, highlight=False)
        console.print("  " + c.shell_line(), markup=False, highlight=False, soft_wrap=True)
    from ..outputs import plan_places

    console.rule("checkpoints and final model")
    for rank, label, where in plan_places(plan):
        console.print(f"  node {rank} ({label}): {where}", markup=False, highlight=False)


def run_checks(preset: Preset, transports: dict[int, Transport],
               console: Optional[Console] = None) -> tuple[ClusterFacts, list, Optional[dict]]:
    """Gather facts and what they lead to: (facts, advice and findings, the check report).

    One machine: only a busy port can go wrong before launch. Several: the probe, port,
    firewall and bandwidth checks, then the rehearsal when those passed. The advice rules
    and the checks overlap (a missing data file is both); each (code, node) is said once.
    """
    from ..advice import advise

    if all(n.is_local for n in preset.cluster.nodes):
        facts = ClusterFacts(master_port_free=local_port_free(preset.network.master_port) is None)
        return facts, list(advise(preset, facts)), None
    from ..nodes.checks import add_rehearsal, run_checks as check_nodes

    if console:
        console.print("checking the nodes (probe, ports, firewall, bandwidth)…")
    rep = check_nodes(preset, transports)
    if rep.ok:
        if console:
            console.print("rehearsal: rendezvous and all-reduce on every node…")
        add_rehearsal(preset, transports, rep, local_python=sys.executable)
    advice = list(advise(preset, rep.facts))
    said = {(a.code, getattr(a, "node", None)) for a in advice}
    findings = [f for f in rep.findings if f.level != "info" and (f.code, f.node) not in said]
    return rep.facts, advice + findings, rep.to_dict()


def print_advice(advice: list, console: Console) -> None:
    if not advice:
        console.print("[green]checks: nothing to warn about[/]")
        return
    t = Table(title="checks and advice")
    for col in ("level", "code", "message", "fix"):
        t.add_column(col)
    colours = {"error": "bold red", "warning": "yellow", "info": "cyan"}
    for a in advice:
        fix = getattr(a.fix, "label", a.fix) if a.fix else ""
        # Text, not markup: messages carry user values (paths, hosts); control characters escaped
        t.add_row(f"[{colours.get(a.level, '')}]{a.level}[/]", a.code, Text(printable(a.message)),
                  Text(printable(str(fix or ""))))
    console.print(t)


def start_run(preset: Preset, plan: LaunchPlan, transports: dict[int, Transport], facts: ClusterFacts,
              root: Path, check_report: Optional[dict] = None) -> Launcher:
    """Record the run (plan, preset, facts, the check matrix) in a new run directory and
    start every node. The one launch step of `replay` and the wizard. Raises LaunchError."""
    rd = RunDir.create(root, plan.run_id)
    save_preset(preset, rd.path / "preset.yaml", mode=0o600)  # it may hold secrets (network.env)
    write_json_atomic(rd.path / "facts.json", facts.to_dict())
    if check_report is not None:
        write_json_atomic(rd.path / "check.json", check_report)
    la = Launcher(plan, transports, rd)
    la.start()
    return la


def prepare_and_launch(preset_path: str, *, dry_run: bool, runs_root: Optional[str], accept_new_host_keys: bool,
                       force: bool, skip_checks: bool, max_seconds: Optional[float]) -> int:
    console = Console(stderr=False)
    preset = load_preset(preset_path)
    name = preset.name or Path(preset_path).stem
    root = Path(runs_root).absolute() if runs_root else default_runs_root()
    run_id = new_run_id(name)
    run_path = root / run_id
    plan = make_plan(preset, run_id=run_id, local_run_dir=str(run_path), base_dir=os.getcwd(),
                     local_python=sys.executable)
    if dry_run:
        print_plan(plan, console)
        return 0

    conns = connect(preset, accept_new_host_keys=accept_new_host_keys)
    failed = {i: e for i, e in conns.items() if isinstance(e, Exception)}
    transports: dict[int, Transport] = {i: t for i, t in conns.items() if not isinstance(t, Exception)}
    try:
        if failed:
            for i, e in failed.items():
                console.print(f"[bold red]node {i} ({preset.cluster.nodes[i].label}): {e}[/]")
            console.print("[bold red]not launched: every node must be reachable[/]")
            return 1
        facts, report = ClusterFacts(), None
        if not skip_checks:
            facts, advice, report = run_checks(preset, transports, console)
            print_advice(advice, console)
            errors = [a for a in advice if a.level == "error"]
            if errors and not force:
                console.print(f"[bold red]not launched: {len(errors)} error(s) above (--force launches anyway)[/]")
                return 1
            plan = make_plan(preset, run_id=run_id, local_run_dir=str(run_path), base_dir=os.getcwd(), facts=facts,
                             local_python=sys.executable)
        print_plan(plan, console)
        try:
            la = start_run(preset, plan, transports, facts, root, report)
        except LaunchError as e:
            console.print(f"[bold red]{e}[/]")
            return 1
        console.print(f"run directory: {la.run_dir.path}  (re-attach: qwen-tui attach {la.run_dir.path})")
        from .live import follow

        out = follow(la, console, max_seconds=max_seconds)
        return out.exit_code
    finally:
        for t in transports.values():
            t.close()


FINAL = {"ok": 0, "failed": 1, "stopped": 130, "lost": 1}


def attach(run_dir: str, *, accept_new_host_keys: bool, stop: bool) -> int:
    """Follow (or stop) a run from its run directory. Never signals a process that does
    not prove it is this run's job, and never signals a run that has ended."""
    console = Console()
    rd = RunDir(Path(run_dir))
    try:
        plan = rd.read_plan()
        state = rd.read_state()
        rd.read_jobs(len(plan.nodes))
    except RunDirError as e:
        console.print(f"[bold red]cannot attach: {e}[/]", markup=True, highlight=False)
        return 2
    status = state.get("status")
    if status in FINAL:
        what = "nothing to stop" if stop else "nothing to follow"
        console.print(f"run {plan.run_id} already ended ({status}): {state.get('message', '')}; {what}",
                      markup=False, highlight=False)
        return 0 if stop else FINAL[status]
    preset = load_preset(rd.path / "preset.yaml")
    conns = connect(preset, accept_new_host_keys=accept_new_host_keys)
    bad = {i: e for i, e in conns.items() if isinstance(e, Exception)}
    transports = {i: t for i, t in conns.items() if not isinstance(t, Exception)}
    try:
        if bad:
            for i, e in bad.items():
                console.print(f"[bold red]node {i}: {e}[/]")
            return 1
        la = Launcher.attach(rd, transports)
        refused = la.refusals()
        if refused:
            for r, why in sorted(refused.items()):
                console.print(f"node {r} ({la.nodes[r].label}): refusing to signal pid {la.nodes[r].pid}: {why}",
                              style="bold red", markup=False, highlight=False)
            console.print("nothing was signalled: the run directory does not describe processes of this run",
                          style="bold red")
            return 1
        if stop:
            ended = la.poll()  # every node may have written its exit code since
            if ended is not None:
                console.print(f"run {plan.run_id} already ended ({ended.status}): {ended.message}; nothing to stop",
                              markup=False, highlight=False)
                return 0
            out, left = la.stop_and_record()
            if left:
                console.print(f"[bold red]processes left on node(s) {left}[/]")
                return 1
            console.print(out.message)
            return 0
        from .live import follow

        return follow(la, console).exit_code
    finally:
        for t in transports.values():
            t.close()
