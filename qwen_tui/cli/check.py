"""`qwen-tui check PRESET`: every node check as one matrix (node x check), a
verdict per cell, the findings with their fixes below it; `--json` for scripts.
`qwen-tui keys PRESET`: the SSH key setup (asks the password once, in memory)."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from qwen_tui.base.redact import printable
from qwen_tui.cli import styles

COLOURS = {**styles.LEVEL, **styles.VERDICT}  # a finding's level or a matrix cell's verdict -> its colour


# The matrix fits 100 columns: a mark a cell, the legend under it; the checks keep their names in --json.
MARKS = {"ok": "✔", "warning": "!", "error": "✘", "not checked": "?", "-": "-"}
LEGEND = ("✔ ok   ! warning   ✘ error   ? not checked (--json says why)   - does not apply;   nccl: NCCL's ports, "
          "link: bandwidth")
HEADERS = {"nccl-ports": "nccl", "bandwidth": "link"}  # the matrix's shorter words for two checks


def matrix(rep, title: str, *, containers: bool) -> Table:
    """The node x check matrix: a row a node, a column a check, a coloured mark a cell. The checks' columns keep
    their whole names; a long node label gives way first. `containers`: the preset runs the nodes' jobs in a
    container (the container column is shown only then)."""
    from qwen_tui.nodes.checks.runner import COLUMNS

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=0, show_edge=False)
    columns = [c for c in COLUMNS if c != "container" or containers]
    # 100 columns less the checks' (each its name and a space): what a node's label may take before it is cut
    room = 100 - sum(len(HEADERS.get(c, c)) + 1 for c in columns)
    t.add_column("node", no_wrap=True, overflow="ellipsis", min_width=6, max_width=room)
    for c in columns:
        h = HEADERS.get(c, c)
        t.add_column(h, justify="center", no_wrap=True, min_width=len(h))
    for i, lab in enumerate(rep.labels):
        # Text, not markup: user values (labels) are never read as markup
        cells = [Text(MARKS.get(v, v), style=COLOURS.get(v, "")) for v in (rep.verdict(i, c) for c in columns)]
        t.add_row(Text(f"{i} {printable(lab)}"), *cells)
    return t


def add_parser(sub) -> None:
    c = sub.add_parser("check", help="check every node: SSH, Python stack, GPUs, data, ports, firewall, "
                                     "bandwidth, rehearsal",
                       description="Check every node of a preset before launch: SSH, the Python stack against the "
                       "master's, GPUs and their topology, the code, data and model, disk and limits, the master "
                       "and NCCL ports, the firewall, iperf3 bandwidth, and a few-second torchrun rehearsal with "
                       "the run's own backend, interfaces and ports. Prints a node x check matrix and each finding "
                       "with its fix; exits 1 on any error. It changes nothing on the nodes, except with --sync, "
                       "which copies what a node lacks from the master first.")
    c.add_argument("preset", help="a preset YAML file")
    c.add_argument("--accept-new-host-keys", action="store_true",
                   help="trust and record host keys seen for the first time")
    c.add_argument("--json", action="store_true", help="print the results as JSON")
    c.add_argument("--out", help="also write the results (JSON) to this file")
    c.add_argument("--no-rehearsal", action="store_true", help="skip the torchrun rehearsal")
    c.add_argument("--sync", action="store_true", help="copy missing data/model/code from the master to the nodes")
    c.add_argument("--overwrite", action="store_true", help="with --sync: also replace files that differ")
    c.add_argument("--bandwidth-seconds", type=float, default=2.0,
                   help="how long each iperf3 measurement between the master and a node runs (default 2)")
    c.set_defaults(func=run)
    k = sub.add_parser("keys", help="set up passwordless SSH to every node and between all nodes "
                                    "(asks the password once)",
                       description="Set up passwordless SSH: an ed25519 key (made if there is none) installed on "
                       "every node with the nodes' password, asked once and kept in memory only, then the "
                       "all-pairs matrix of which node reaches which without a password, as torchrun's agents "
                       "need. A new host key is refused unless accepted; a changed one always is.")
    k.add_argument("preset", help="a preset YAML file")
    k.add_argument("--accept-new-host-keys", action="store_true",
                   help="trust and record host keys seen for the first time (without it, a new key asks "
                   "or is refused; a changed key is always refused)")
    k.set_defaults(func=run_keys)


class NodeLines:
    """What `check` shows while it runs: on a terminal, a live line per node that changes as each
    of its checks finishes (and the check running now); elsewhere (a log, a pipe) each node's
    outcome as a line of its own, as it comes."""

    def __init__(self, console: Console, labels: list[str]) -> None:
        from rich.live import Live

        self.console, self.labels = console, labels
        self.now = f"connecting to {len(labels)} node(s)…"
        self.done: dict[int, list[Text]] = {i: [] for i in range(len(labels))}
        self.doing: dict[int, str] = {}
        self.live = Live(console=console, transient=True, refresh_per_second=8) if console.is_terminal else None

    def __enter__(self) -> "NodeLines":
        if self.live is not None:
            self.live.update(self.render())
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def render(self) -> Table:
        t = Table.grid(padding=(0, 1))
        t.add_row(Text(f"… {self.now}", style=styles.WARN))
        for i, lab in enumerate(self.labels):
            line = Text(f"  {i} {printable(lab):14} ")
            for part in self.done[i][-6:]:  # the latest outcomes: a line stays a line
                line.append_text(part)
                line.append("  ")
            if i in self.doing:
                line.append(f"… {self.doing[i]}", style=styles.WARN)
            t.add_row(line)
        return t

    def __call__(self, check: str, node: int | None, text: str) -> None:
        """A check begins (node None) or one node's outcome of it."""
        if node is None:
            self.now = f"{check}: {text}"
            for i in self.done:
                self.doing[i] = check
        else:
            bad = any(w in text for w in ("failed", "cannot", "not measured"))
            self.doing.pop(node, None)
            self.done[node].append(Text(f"{'✘' if bad else '✔'} {check}", style=styles.WARN if bad else styles.GOOD))
            if self.live is None:
                self.console.print(f"  {check:9} {node} {escape(printable(self.labels[node])):14} "
                                   f"[{styles.WARN if bad else styles.GOOD}]{escape(printable(text))}[/]",
                                   highlight=False)
        if self.live is not None:
            self.live.update(self.render())

    def event(self, ev) -> None:
        from qwen_tui.run import api

        if isinstance(ev, api.CheckProgress):
            self(ev.check, ev.node, ev.text)


def _checks(preset, transports, show: NodeLines, *, connect_errors, bandwidth_seconds: float, rehearsal: bool):
    """The node checks through the launch API (as replay and the wizard run them), shown as they go."""
    from qwen_tui.run import api

    result = None
    for ev in api.checking(preset, transports, local_python=sys.executable, connect_errors=connect_errors,
                           bandwidth_seconds=bandwidth_seconds, rehearsal=rehearsal, on_one_machine=True):
        show.event(ev)
        if isinstance(ev, api.Checked):
            result = ev.result
    assert result is not None and result.checks is not None  # checking() ends with Checked, on_one_machine
    return result.checks


def run(args: argparse.Namespace) -> int:
    from qwen_tui.preset.files import load_preset
    from qwen_tui.run.api import Connections

    console = Console(stderr=args.json)
    preset = load_preset(args.preset)
    slurm = preset.scheduler.is_slurm
    if slurm and not preset.cluster.nodes:
        from qwen_tui.cli.slurm_inside import allocation_id

        job = allocation_id()
        if job is None:  # a login node: the nodes to check are an allocation's
            return _in_allocation(args, preset, console)
        from qwen_tui.cli.slurm_inside import in_allocation

        on = in_allocation(preset, job, console)
        if on is None:
            return 2
        preset = on
    t0 = time.monotonic()
    labels = [n.label for n in preset.cluster.nodes]
    conns = Connections()
    rehearsal = not args.no_rehearsal
    try:
        with NodeLines(console, labels) as show:
            show("ssh", None, f"connecting to {len(labels)} node(s)")
            res = conns.connect(preset, consent=args.accept_new_host_keys)
            for i in range(len(labels)):
                e = res[i]
                show("ssh", i, f"cannot connect: {e}" if isinstance(e, BaseException) else "connected")
            transports, failed = dict(res.succeeded), res.failed
            checks = dict(connect_errors=failed, bandwidth_seconds=args.bandwidth_seconds)
            rep = _checks(preset, transports, show, rehearsal=rehearsal and not args.sync, **checks)
            download_failed = None
            if args.sync and 0 in transports:
                from qwen_tui.nodes.hubmodel import download_on_master, hub_id
                from qwen_tui.nodes.sync import sync

                if hub_id(preset.training.model):  # the master downloads once; the sync below copies it
                    action, path, detail = download_on_master(
                        preset, transports[0], python=preset.cluster.nodes[0].python_for(sys.executable))
                    console.print(f"download {preset.cluster.nodes[0].label} model: {action} {path} {detail}",
                                  markup=False, highlight=False)
                    if action == "failed":
                        download_failed = detail
                    elif action == "downloaded":  # the master's copy is a fact only now
                        rep = _checks(preset, transports, show, rehearsal=False, **checks)
                from qwen_tui.nodes.hubmodel import hub_datasets

                for repo in hub_datasets(preset):  # each hub data set once, on the master; the sync copies it
                    action, path, detail = download_on_master(
                        preset, transports[0], python=preset.cluster.nodes[0].python_for(sys.executable),
                        dataset=repo)
                    console.print(f"download {preset.cluster.nodes[0].label} data set {repo}: {action} {path} "
                                  f"{detail}", markup=False, highlight=False)
                    if action == "failed":
                        download_failed = detail
                res = sync(preset, transports, rep.facts, overwrite=args.overwrite,
                           progress=lambda n, p, d, t: console.print(f"  {preset.cluster.nodes[n].label}: {p} "
                                                                     f"{d * 100 // max(t, 1)}%", end="\r"))
                for i, acts in sorted(res.items()):
                    for a in ([] if isinstance(acts, BaseException) else acts):
                        console.print(f"sync {preset.cluster.nodes[i].label} {a.kind}: {a.action} {a.detail}")
                    if isinstance(acts, BaseException):
                        console.print(f"[{styles.FAIL}]sync {preset.cluster.nodes[i].label}: {acts}[/]")
                # what the nodes hold now; the rehearsal once the copies are there (not after a failed download)
                rep = _checks(preset, transports, show, rehearsal=rehearsal and not download_failed, **checks)
    finally:
        conns.close()
    if download_failed:
        from qwen_tui.nodes.checks.findings import ERROR, Finding

        rep.findings.append(Finding(ERROR, "MODEL_DOWNLOAD_FAILED", download_failed,
                                    "check HF_ENDPOINT / HF_TOKEN (network.env), or set HF_HUB_OFFLINE=1 with "
                                    "the model in the master's hub cache", 0, "model"))
    rep.seconds = time.monotonic() - t0
    data = rep.to_dict()
    if args.out:
        from qwen_tui.run.rundir import write_json_atomic

        write_json_atomic(Path(args.out), data)
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0 if rep.ok else 1
    console.print(matrix(rep, f"qwen-tui check {args.preset}  ({rep.seconds:.0f}s)",
                         containers=preset.container is not None))
    console.print(LEGEND, style=styles.QUIET, highlight=False)
    said: set = set()
    for f in sorted(rep.findings, key=lambda f: ({"error": 0, "warning": 1}.get(f.level, 2), f.node or 0)):
        who = rep.labels[f.node] if f.node is not None and f.node < len(rep.labels) else "cluster"
        if (f.level, f.code, who, f.message, f.fix) in said:  # two nodes on one machine: the same words once
            continue
        said.add((f.level, f.code, who, f.message, f.fix))
        # messages carry user values (paths, hosts): escaped, never read as markup or terminal codes
        console.print(f"[{COLOURS.get(f.level, '')}]{f.level:7}[/] {escape(printable(who)):12} {f.code}: "
                      f"{escape(printable(f.message))}", markup=True, highlight=False)
        if f.fix:
            console.print(f"{'':20} fix: {printable(f.fix)}", markup=False, highlight=False)
    console.print(f"[{styles.GOOD}]all checks passed[/]" if rep.ok
                  else f"[{styles.BAD}]{len(rep.errors)} error(s)[/]")
    return 0 if rep.ok else 1


# How long `check` waits for SLURM to grant the allocation it checks, and how long it asks for.
CHECK_ALLOCATION_WAIT_S = 300
CHECK_ALLOCATION_TIME = "00:15:00"


def _in_allocation(args: argparse.Namespace, preset, console: Console) -> int:
    """`qwen-tui check` of a SLURM preset on a login node: the same check, run again inside a short allocation of
    the nodes the preset asks for (salloc), so that every check runs on nodes SLURM gives, through srun."""
    import subprocess

    from qwen_tui.run.export.slurm_preset import allocation_options

    argv = ["salloc", *allocation_options(preset, time=CHECK_ALLOCATION_TIME),
            f"--immediate={CHECK_ALLOCATION_WAIT_S}", "--job-name=qwen-tui-check",
            sys.executable, "-m", "qwen_tui.cli", *sys.argv[1:]]
    console.print(f"no SLURM allocation here: asking for one to check ({preset.scheduler.nodes} node(s), at most "
                  f"{CHECK_ALLOCATION_TIME}; salloc waits up to {CHECK_ALLOCATION_WAIT_S} s for it)",
                  markup=False, highlight=False)
    try:
        return subprocess.call(argv)
    except FileNotFoundError:
        console.print(f"[{styles.BAD}]salloc is not installed here: run qwen-tui check on a login node of the "
                      "cluster (SLURM's client commands), or inside an allocation[/]")
        return 2


def run_keys(args: argparse.Namespace) -> int:
    from qwen_tui.nodes.keys import KeyLocked, identity_for, key_is_encrypted, setup_keys
    from qwen_tui.nodes.transport.protocol import TransportError
    from qwen_tui.preset.files import load_preset

    preset = load_preset(args.preset)
    console = Console()
    if all(n.is_local for n in preset.cluster.nodes):  # no SSH anywhere: never make a key pair nobody asked for
        console.print(f"every node of {printable(args.preset)} is this machine: no SSH key is needed, nothing to do",
                      markup=False, highlight=False)
        return 0
    password = getpass.getpass("SSH password for the nodes (used once, kept in memory only): ") \
        if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    try:
        ident = identity_for(preset)
    except TransportError as e:  # the preset's ssh_config cannot be read
        print(f"qwen-tui keys: {e}", file=sys.stderr)
        return 2
    passphrase = None
    if key_is_encrypted(ident):
        # asked like the password (the next stdin line when not a terminal); empty: use ssh-agent
        prompt = f"passphrase of {ident} (kept in memory only; empty: use ssh-agent): "
        passphrase = getpass.getpass(prompt) if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    try:
        rep = setup_keys(preset, password or None, accept_new_host_keys=args.accept_new_host_keys,
                         passphrase=passphrase or None)
    except KeyLocked as e:
        print(f"qwen-tui keys: {e}", file=sys.stderr)
        return 2
    finally:
        del password, passphrase
    labels = [n.label for n in preset.cluster.nodes]
    console.print(f"key: {rep.key.private_path}" + (" (new)" if rep.key.created else ""))
    for i, v in sorted(rep.installed.items()):
        console.print(f"{labels[i]}: " + (f"[{styles.FAIL}]{v}[/]" if isinstance(v, BaseException) else
                                          ("key installed" if v else "key already there")))
    t = Table(title="node -> node without a password")
    t.add_column("from \\ to")
    for lab in labels:
        t.add_column(lab)
    for a, la in enumerate(labels):
        row = []
        for b in range(len(labels)):
            if a == b:
                row.append("-")
            elif (a, b) not in rep.matrix:
                row.append(f"[{styles.QUIET}]?[/]")
            else:
                row.append(f"[{styles.GOOD}]ok[/]" if rep.matrix[(a, b)] is None
                           else f"[{styles.FAIL}]{rep.matrix[(a, b)]}[/]")
        t.add_row(la, *row)
    console.print(t)
    return 0 if rep.ok else 1
