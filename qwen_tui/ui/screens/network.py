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
from textual.widgets import DataTable, Input, Label, Static

from ...nodes.checks import replace_findings, run_checks, run_network_check
from ...nodes.sync import sync_from_master
from ..messages import ActionDone
from ..modals import Confirm, Notice
from ..widgets.bandwidth import BandwidthBars
from .base import StepScreen


def _yn(v, err=None) -> Text:
    if v is None:
        return Text(err[:60] if err else "not checked", style="red" if err else "dim")
    return Text("✔ reachable", style="green") if v else Text(f"✘ {err or 'blocked'}"[:60], style="red")


class NetworkScreen(StepScreen):
    STEP = "network"
    AUTO_FOCUS = "DataTable"  # letter keys act; Tab reaches the inputs
    BINDINGS = [Binding("r", "check", "All checks"),
                Binding("p", "check_one('port')", "Ports"),
                Binding("f", "check_one('firewall')", "Firewall"),
                Binding("b", "check_one('bandwidth')", "Bandwidth"),
                Binding("s", "sync", "Sync from master")]

    def body(self) -> ComposeResult:
        yield Label("Network: workers reach the master on one port; collectives need bandwidth.", classes="intro")
        with Horizontal(classes="row"):
            yield Label("master port", classes="field-label")
            yield Input(id="master_port", type="integer", classes="short")
            yield Label("interface", classes="field-label")
            yield Input(id="interface", placeholder="auto (from the probe)", classes="short")
        yield Static(id="field-errors", classes="field-error")
        yield DataTable(id="net-table", cursor_type="row")
        yield Label("iperf3 bandwidth, worker → master", classes="section")
        yield BandwidthBars(id="bars")
        yield Static(id="net-findings")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("#", "node", "interface", "addresses", "master port", "firewall")
        net = self.state.preset.network
        self.query_one("#master_port", Input).value = str(net.master_port)
        self.query_one("#interface", Input).value = net.interface or ""
        super().on_mount()

    def on_input_changed(self, ev: Input.Changed) -> None:
        path = {"master_port": "network.master_port", "interface": "network.interface"}.get(ev.input.id or "")
        if path is None:
            return
        v = ev.value.strip()
        value = (int(v) if v.lstrip("-").isdigit() else v) if ev.input.id == "master_port" else (v or None)
        self.change(path, value)

    def show_field_errors(self, errors, changes) -> None:
        self.query_one("#field-errors", Static).update(
            Text("\n".join(f"{e.path}: {e.message}" for e in errors), style="red"))

    def refresh_state(self) -> None:
        st = self.state
        t = self.query_one(DataTable)
        t.clear()
        for i, n in enumerate(st.preset.cluster.nodes):
            nf = st.node_facts(i)
            iface = st.preset.network.interface or (nf.route_interface if nf else None) or "?"
            addrs = ", ".join(a for v in (nf.addresses.values() if nf else []) for a in v) or "-"
            if i == 0:
                port = {None: Text("not checked", style="dim"), True: Text("✔ free here", style="green"),
                        False: Text("✘ in use", style="red")}[st.facts.master_port_free]
            else:
                lk = st.facts.links.get(i)
                port = _yn(lk.port_reachable if lk else None, lk.port_error if lk else None)
            lk = st.facts.links.get(i)
            fw = Text("; ".join(lk.firewall)[:60], style="red") if lk and lk.firewall else Text("-", style="dim")
            t.add_row(str(i), n.label, iface, addrs[:40], port, fw)
        self.query_one(BandwidthBars).show([n.label for n in st.preset.cluster.nodes], st.facts)
        txt = Text()
        for a in st.net_findings:
            if a.check and a.check not in ("port", "nccl-ports", "firewall", "bandwidth", "rehearsal"):
                continue  # probe findings belong to the Nodes step
            colour = {"error": "red", "warning": "yellow"}.get(a.level, "cyan")
            txt.append(f"{'✘' if a.level == 'error' else '!' if a.level == 'warning' else 'i'} {a.code}: {a.message}\n",
                       style=colour)
            if a.fix:
                txt.append(f"    fix: {a.fix}\n", style="dim")
        if not st.net_findings and not st.net_checked:
            txt.append("Not checked yet: r runs the port, firewall and iperf3 checks from every node; "
                       "p, f or b runs one of them.", style="dim")
        self.query_one("#net-findings", Static).update(txt)

    def action_check(self) -> None:
        self.notify("running the network checks…")
        self.check()

    @work(thread=True, exclusive=True, exit_on_error=False, group="net")
    def check(self) -> None:
        conns = self.connect_nodes()
        if not conns.ok:
            self.post_message(ActionDone("net", error="; ".join(conns.errors_text())))
            return
        rep = run_checks(self.state.preset, conns.succeeded, local_python=self.wizard.local_python)
        self.post_message(ActionDone("net", result=(rep.facts, rep.findings)))

    def action_check_one(self, which: str) -> None:
        self.notify(f"running the {which} check…")
        self.check_one(which)

    @work(thread=True, exclusive=True, exit_on_error=False, group="net")
    def check_one(self, which: str) -> None:
        conns = self.connect_nodes()
        if not conns.ok:
            self.post_message(ActionDone("net-one", error="; ".join(conns.errors_text())))
            return
        facts, findings = run_network_check(self.state.preset, conns.succeeded, which, self.state.facts)
        self.post_message(ActionDone("net-one", result=(which, facts, findings)))

    def action_sync(self) -> None:
        self.notify("copying what the nodes lack from the master…")
        self.sync_files(False)

    @work(thread=True, exclusive=True, exit_on_error=False, group="net")
    def sync_files(self, overwrite: bool) -> None:
        conns = self.connect_nodes()
        if not conns.ok or 0 not in conns.succeeded:
            self.post_message(ActionDone("net-sync", error="; ".join(conns.errors_text())
                                         or "the master is not connected"))
            return
        lines, differ = sync_from_master(self.state.preset, conns.succeeded, self.state.facts, overwrite=overwrite)
        self.post_message(ActionDone("net-sync", result=(lines, differ)))

    def _sync_done(self, msg: ActionDone) -> None:
        if msg.error:
            self.notify(msg.error, severity="error", title="Sync")
            return
        lines, differ = msg.result

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

    def on_action_done(self, msg: ActionDone) -> None:
        if msg.action == "net-sync":
            self._sync_done(msg)
            return
        if msg.action == "net-one":
            self._one_done(msg)
            return
        if msg.action != "net":
            return
        if msg.error:
            self.notify(msg.error, severity="error", title="Network checks")
            return
        facts, findings = msg.result
        st = self.state
        st.facts = st.facts.merged(facts)
        st.net_findings, st.net_checked = findings, True
        for i, nf in facts.nodes.items():
            st.node(i).probe = f"error: {nf.error}" if nf.error else "ok"
        self.wizard.facts_changed()
        errs = [a for a in findings if a.level == "error"]
        self.notify(f"{len(errs)} problem(s) found" if errs else "network checks passed",
                    severity="error" if errs else "information", title="Network checks")

    def _one_done(self, msg: ActionDone) -> None:
        if msg.error:
            self.notify(msg.error, severity="error", title="Network check")
            return
        which, facts, findings = msg.result
        st = self.state
        st.facts = st.facts.merged(facts)
        st.net_findings = replace_findings(st.net_findings, findings, which)
        self.wizard.facts_changed()
        errs = [a for a in findings if a.level == "error"]
        self.notify(f"{which}: {len(errs)} problem(s) found" if errs else f"{which} check passed",
                    severity="error" if errs else "information", title="Network check")
