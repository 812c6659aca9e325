"""Step 3, Network: master port and interface, port reachability from every
worker, firewall findings and iperf3 bandwidth per worker against the 10 Gbit/s
line. `r` re-runs all the checks (the same ones `replay` runs before launching);
`p`, `f` and `b` re-run one of them (ports, firewall, bandwidth) and leave what
the others found as it was. `s` copies the data, model and training code from the
master to the nodes that lack them (checksum-verified, as `check --sync`); a copy
that differs is replaced only after a yes."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import DataTable, Input, Label, Select, Static

from ...base.levels import Level
from ...run import api
from ...wizard.state import BAD, WARN, finding_line
from ..messages import NetChecked, NetOneChecked, NetProgress, Synced
from ..modals import Confirm, Notice
from ..styles import FAIL, GOOD, WARNING, level_style, tone
from ..widgets.bandwidth import BandwidthBars
from ..widgets.form_inputs import FieldInput, OrderedSelect
from .base import StepScreen


def _yn(v, err=None) -> Text:
    if v is None:
        return Text(err[:60] if err else "not checked", style=tone(FAIL) if err else "dim")
    return Text("✔ reachable", style=tone(GOOD)) if v else Text(f"✘ {err or 'blocked'}"[:60], style=tone(FAIL))


NET_CHECKS = ("port", "nccl-ports", "firewall", "bandwidth", "rehearsal")


def shown_findings(findings: list) -> list:
    """The findings this step lists (probe findings belong to the Nodes step): the toast counts these too."""
    return [a for a in findings if not a.check or a.check in NET_CHECKS]


def verdict(state, findings: list, what: str, *, whole: bool = True) -> tuple[str, str]:
    """The toast after a check, from what the list and the stepper show: (text, severity).
    whole: all the checks ran, so the step's colour is this check's verdict too."""
    shown = shown_findings(findings)
    errs = [a.code for a in shown if a.level == Level.ERROR]
    warns = [a.code for a in shown if a.level == Level.WARNING]
    status = state.step_status("network") if whole else None
    if errs or status == BAD:
        return f"{what}: {len(errs) or 'some'} problem(s): {', '.join(errs) or 'see the table'}", "error"
    if warns or status == WARN:
        return f"{what}: passed with {len(warns)} warning(s): {', '.join(warns)}", "warning"
    return f"{what}: passed", "information"


class NetworkScreen(StepScreen):
    STEP = "network"
    AUTO_FOCUS = "DataTable"  # letter keys act; Tab reaches the inputs
    BINDINGS = [Binding("r", "check", "All checks"),
                Binding("p", "check_one('port')", "Ports"),
                Binding("f", "check_one('firewall')", "Firewall"),
                Binding("b", "check_one('bandwidth')", "Bandwidth"),
                Binding("s", "sync", "Sync")]

    def body(self) -> ComposeResult:
        yield Label("Network: workers reach the master on one port; collectives need bandwidth.", classes="intro")
        with Horizontal(classes="row"):
            yield Label("master port", classes="field-label")
            yield FieldInput(id="master_port", type="integer", classes="short")
            yield Label("interface", classes="field-label")
            yield FieldInput(id="interface", placeholder="auto (from the probe)", classes="short")
        with Horizontal(classes="row"):
            yield Label("backend", classes="field-label")
            yield OrderedSelect([("auto (nccl on GPUs)", "auto"), ("nccl", "nccl"), ("gloo", "gloo")],
                                id="backend", allow_blank=False, value=self.state.preset.network.backend,
                                classes="short")
            yield Label("rendezvous timeout (s)", classes="field-label")
            yield FieldInput(id="rdzv_timeout", type="integer", classes="short")
        yield Static(id="field-errors", classes="field-error")
        yield Static(id="net-progress")
        yield DataTable(id="net-table", cursor_type="row")
        yield Label("iperf3 bandwidth, worker → master", classes="section")
        yield BandwidthBars(id="bars")
        yield Static(id="net-findings")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("#", "node", "interface", "addresses", "master port", "firewall")
        net = self.state.preset.network
        self.query_one("#master_port", Input).value = str(net.master_port)
        self.query_one("#interface", Input).value = net.interface or ""
        self.query_one("#rdzv_timeout", Input).value = str(net.rdzv_timeout)
        super().on_mount()

    def on_screen_resume(self) -> None:
        """Opening a preset or a fix may have changed these; a refused value stays until it is fixed."""
        net = self.state.preset.network
        for wid, value in (("master_port", str(net.master_port)), ("interface", net.interface or ""),
                           ("rdzv_timeout", str(net.rdzv_timeout))):
            w = self.query_one(f"#{wid}", Input)
            if f"network.{wid}" not in self.state.field_errors and w.value != value:
                w.value = value
        if self.query_one("#backend", Select).value != net.backend:
            self.query_one("#backend", Select).value = net.backend
        super().on_screen_resume()

    def on_select_changed(self, ev: Select.Changed) -> None:
        if ev.select.id == "backend":
            self.change("network.backend", ev.value)

    def on_input_changed(self, ev: Input.Changed) -> None:
        path = {"master_port": "network.master_port", "interface": "network.interface",
                "rdzv_timeout": "network.rdzv_timeout"}.get(ev.input.id or "")
        if path is None:
            return
        v = ev.value.strip()
        number = ev.input.id in ("master_port", "rdzv_timeout")
        value = (int(v) if v.lstrip("-").isdigit() else v) if number else (v or None)
        self.change(path, value)

    def show_field_errors(self, errors, changes) -> None:
        from ...base.field_words import plain

        labels = {"network.master_port": "master port", "network.interface": "interface",
                  "network.rdzv_timeout": "rendezvous timeout", "network.backend": "backend"}
        self.query_one("#field-errors", Static).update(
            Text("\n".join(plain(e.path, e.message, changes.get(e.path), labels) for e in errors), style=tone(FAIL)))

    SLURM_NOTE = ("SLURM gives this run its nodes: their ports, firewall, bandwidth and a rehearsal are checked "
                  "through srun inside the batch job, before training; `qwen-tui check PRESET` checks nodes SLURM "
                  "gives now (salloc)")

    def refresh_state(self) -> None:
        st = self.state
        t = self.query_one(DataTable)
        t.clear()
        t.display = not st.preset.scheduler.is_slurm
        if st.preset.scheduler.is_slurm:
            self.query_one("#net-findings", Static).update(Text(self.SLURM_NOTE + ".", style="dim"))
            return
        for i, n in enumerate(st.preset.cluster.nodes):
            nf = st.node_facts(i)
            iface = st.preset.network.interface or (nf.route_interface if nf else None) or "?"
            addrs = ", ".join(a for v in (nf.addresses.values() if nf else []) for a in v) or "-"
            if i == 0:
                port = {None: Text("not checked", style="dim"), True: Text("✔ free here", style=tone(GOOD)),
                        False: Text("✘ in use", style=tone(FAIL))}[st.facts.master_port_free]
            else:
                lk = st.facts.links.get(i)
                port = _yn(lk.port_reachable if lk else None, lk.port_error if lk else None)
            lk = st.facts.links.get(i)
            fw = Text("; ".join(lk.firewall)[:60], style=tone(WARNING)) if lk and lk.firewall else Text("-", style="dim")
            t.add_row(str(i), n.label, iface, addrs[:40], port, fw)
        self.query_one(BandwidthBars).show([n.label for n in st.preset.cluster.nodes], st.facts)
        txt = Text()
        labels = [n.label for n in st.preset.cluster.nodes]
        for a in shown_findings(st.net_findings):
            txt.append(finding_line(a, labels) + "\n", style=level_style(a.level))
            if a.fix:
                txt.append(f"    fix: {a.fix}\n", style="dim")
        if not st.net_findings and not st.net_checked:
            txt.append("Not checked yet: r runs the port, firewall and iperf3 checks from every node; "
                       "p, f or b runs one of them.", style="dim")
        self.query_one("#net-findings", Static).update(txt)

    _progress: list[str] = []

    def _show_progress(self, line: str | None) -> None:
        """What the running check is doing, node by node (None: nothing runs)."""
        w = self.query_one("#net-progress", Static)
        if line is None:
            self._progress = []
            w.update("")
            return
        self._progress = [*self._progress, line][-8:]
        w.update(Text("\n".join(self._progress), style=tone(WARNING)))

    def action_check(self) -> None:
        if self.slurm_says():
            return
        self._progress = []
        self._show_progress("… connecting to every node")
        self.check()

    @work(thread=True, exclusive=True, exit_on_error=False, group="net")
    def check(self) -> None:
        conns = self.connect_nodes()
        if not conns.ok:
            self.post_message(NetChecked(error="; ".join(conns.errors_text())))
            return

        rep = None
        # the same checks `check` and a launch run (the rehearsal is the launch's: Review, F5)
        for ev in api.checking(self.state.preset, conns.succeeded, local_python=self.wizard.local_python,
                               rehearsal=False, on_one_machine=True):
            if isinstance(ev, api.CheckProgress):
                self.post_message(NetProgress(-1 if ev.node is None else ev.node, ev.check, ev.text))
            elif isinstance(ev, api.Checked):
                rep = ev.result.checks
        assert rep is not None  # checking() ends with Checked; on_one_machine: with the node checks' report
        self.post_message(NetChecked(rep.facts, rep.findings))

    def on_net_progress(self, msg: NetProgress) -> None:
        nodes = self.state.preset.cluster.nodes
        who = f"node {msg.node} ({nodes[msg.node].label})" if 0 <= msg.node < len(nodes) else ""
        self._show_progress(f"… {msg.check}: {msg.text}" if not who else f"  {msg.check}: {who}: {msg.text}")

    def action_check_one(self, which: str) -> None:
        if self.slurm_says():
            return
        self._progress = []
        self._show_progress(f"… the {which} check: connecting, then checking every node")
        self.check_one(which)

    @work(thread=True, exclusive=True, exit_on_error=False, group="net")
    def check_one(self, which: str) -> None:
        conns = self.connect_nodes()
        if not conns.ok:
            self.post_message(NetOneChecked(which, error="; ".join(conns.errors_text())))
            return
        facts, findings = api.network_check(self.state.preset, conns.succeeded, which, self.state.facts)
        self.post_message(NetOneChecked(which, facts, findings))

    def action_sync(self) -> None:
        if self.slurm_says():
            return
        self.notify("copying what the nodes lack from the master…")
        self.sync_files(False)

    @work(thread=True, exclusive=True, exit_on_error=False, group="net")
    def sync_files(self, overwrite: bool) -> None:
        conns = self.connect_nodes()
        if not conns.ok or 0 not in conns.succeeded:
            self.post_message(Synced(error="; ".join(conns.errors_text()) or "the master is not connected"))
            return
        lines, differ = api.sync(self.state.preset, conns.succeeded, self.state.facts, overwrite=overwrite)
        self.post_message(Synced(lines, differ))

    def on_synced(self, msg: Synced) -> None:
        if msg.error:
            self.notify(msg.error, severity="error", title="Sync")
            return
        lines, differ = msg.lines, msg.differ

        def replace(yes: bool | None) -> None:
            if yes:
                self.notify("replacing the differing copies with the master's…")
                self.sync_files(True)
            else:
                self.check()  # what the nodes hold now

        body = "\n".join(lines) or "nothing to copy: no node lacks the data, model or code"
        if differ:
            self.app.push_screen(Confirm("Sync from the master", body + f"\n\nReplace the {differ} copy(ies) "
                                         "that differ from the master's?", yes="Replace", danger=True), replace)
        else:
            self.app.push_screen(Notice("Sync from the master", body), lambda _: self.check())

    def on_net_checked(self, msg: NetChecked) -> None:
        self._show_progress(None)
        if msg.error or msg.facts is None:
            self.notify(msg.error or "no facts came back", severity="error", title="Network checks")
            return
        facts, findings = msg.facts, msg.findings
        st = self.state
        st.facts = st.facts.merged(facts)
        st.net_findings, st.net_checked = findings, True
        for i, nf in facts.nodes.items():
            if nf.error:
                st.node(i).probe_failed(nf.error)
            else:
                st.node(i).probe_ok()
        self.wizard.facts_changed()
        text, severity = verdict(st, st.net_findings, "network checks")
        self.notify(text, severity=severity, title="Network checks")

    def on_net_one_checked(self, msg: NetOneChecked) -> None:
        self._show_progress(None)
        if msg.error or msg.facts is None:
            self.notify(msg.error or "no facts came back", severity="error", title="Network check")
            return
        which, facts, findings = msg.which, msg.facts, msg.findings
        st = self.state
        st.facts = st.facts.merged(facts)
        st.net_findings = api.replace_findings(st.net_findings, findings, which)
        self.wizard.facts_changed()
        text, severity = verdict(st, findings, f"{which} check", whole=False)
        self.notify(text, severity=severity, title="Network check")
