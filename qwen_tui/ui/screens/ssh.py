"""Step 2, SSH: a key (generated or chosen), installed on every node with a password
asked once (memory only), then connections and the all-pairs check. A new host key
is shown with its fingerprint and accepted only on confirmation; a changed one is
refused (the infra module raises ChangedHostKey and we show why)."""

from __future__ import annotations

import os

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import DataTable, Input, Label, Static

from ...run import api
from ...wizard.state import NodeStatus, SshState, connection_fix
from ..messages import ActionDone, SshProgress
from ..modals import PasswordPrompt
from ..styles import FAIL, GOOD, WARNING, tone
from ..widgets.form_inputs import FieldInput
from .base import StepScreen


def _cell(ns: NodeStatus, local: bool) -> Text:
    s = SshState.LOCAL if local else SshState(ns.ssh)
    if s in (SshState.CONNECTED, SshState.LOCAL):
        return Text(f"✔ {s}", style=tone(GOOD))
    if s.failed:  # a refused connection keeps its word: the host key changed, which is news
        return Text(f"✘ {ns.ssh_error if s == SshState.ERROR else f'{s}: {ns.ssh_error}'}"[:72], style=tone(FAIL))
    if s == SshState.CONNECTING:
        return Text(f"… {s}", style=tone(WARNING))
    return Text(s, style="dim")


def key_summary(rep, preset) -> str:
    """What k did, said plainly: a key made on this machine is news even when no node took it."""
    remote = [i for i, n in enumerate(preset.cluster.nodes) if not n.is_local]
    done = [i for i in remote if not isinstance(rep.installed.get(i), BaseException) and i in rep.installed]
    key = f"made a new key {rep.key.private_path}" if rep.key.created else f"used the key {rep.key.private_path}"
    if not done:
        return f"{key}; installed on no node: none could be reached (see the table)"
    if len(done) < len(remote):
        return f"{key}; installed on {len(done)} of {len(remote)} remote node(s): see the table"
    return f"{key}; installed on every remote node" + ("" if rep.ok else "; node-to-node checks found problems")


class SSHScreen(StepScreen):
    STEP = "ssh"
    AUTO_FOCUS = "DataTable"  # letter keys act; Tab reaches the key path
    BINDINGS = [
        Binding("c", "connect", "Connect all"),
        Binding("k", "install_key", "Install key"),
        Binding("v", "verify_pairs", "Verify pairs"),
    ]

    def body(self) -> ComposeResult:
        yield Label("SSH: qwen-tui logs into every node with a key. It can make one and install it for you.",
                    classes="intro")
        with Horizontal(classes="row"):
            yield Label("private key", classes="field-label")
            yield FieldInput(placeholder="~/.ssh/id_ed25519 (made if missing)", id="identity")
        yield DataTable(id="ssh-table", cursor_type="row")
        yield Static(id="ssh-failures")
        yield Static(id="pairs")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("#", "node", "address", "connection", "host key")
        self.query_one("#identity", Input).value = self.state.preset.cluster.identity_file or ""
        super().on_mount()

    def on_input_changed(self, ev: Input.Changed) -> None:
        if ev.input.id == "identity":
            self.change("cluster.identity_file", ev.value.strip() or None)

    SLURM_NOTE = ("SLURM gives this run its nodes: srun reaches them (munge authenticates every job step), so no "
                  "SSH key is needed")

    def refresh_state(self) -> None:
        st = self.state
        t = self.query_one(DataTable)
        t.clear()
        t.display = not st.preset.scheduler.is_slurm
        if st.preset.scheduler.is_slurm:
            self.query_one("#ssh-failures", Static).update("")
            self.query_one("#pairs", Static).update(Text(self.SLURM_NOTE + ".", style=tone(GOOD)))
            return
        for i, n in enumerate(st.preset.cluster.nodes):
            ns = st.node(i)
            addr = "this machine" if n.is_local else f"{n.user + '@' if n.user else ''}{n.host}:{n.port}"
            t.add_row(str(i), n.label, addr, _cell(ns, n.is_local), Text(ns.host_key or "-", style="dim"))
        failed = Text()
        for i, n in enumerate(st.preset.cluster.nodes):  # in full, with the fix: the table cuts them
            ns = st.node(i)
            if SshState(ns.ssh).failed:
                failed.append(f"✘ node {i} ({n.label}): {ns.ssh_error}\n", style=tone(FAIL))
                if ns.fix:
                    failed.append(f"    fix: {ns.fix}\n", style="dim")
        self.query_one("#ssh-failures", Static).update(failed)
        rep = st.key_report
        if rep is None:
            msg = Text("All-pairs check not run yet (v). Nodes log into each other for torchrun/DeepSpeed; "
                       "installing the key (k) also sets that up.", style="dim")
            if all(n.is_local for n in st.preset.cluster.nodes):
                msg = Text("Every node is this machine: no SSH needed.", style=tone(GOOD))
        else:
            labels = [n.label for n in st.preset.cluster.nodes]
            msg = Text(key_summary(rep, st.preset) + "\n", style=tone(GOOD) if rep.ok else tone(WARNING))
            for line in rep.matrix_lines(labels):
                msg.append(line + "\n", style=tone(GOOD) if line.endswith(": ok") else tone(FAIL))
            for i, e in sorted(rep.installed.items()):
                if isinstance(e, BaseException):
                    msg.append(f"install on node {i}: {e}\n", style=tone(FAIL))
        self.query_one("#pairs", Static).update(msg)

    # ---------------------------------------------------------------- connect
    def action_connect(self) -> None:
        if self.slurm_says():
            return
        self.connect_all()

    @work(thread=True, exclusive=True, exit_on_error=False, group="ssh")
    def connect_all(self) -> None:
        res = self.connect_nodes(on_progress=lambda i, s: self.post_message(SshProgress(i, SshState(s))))
        for i, r in res.items():
            if isinstance(r, BaseException):
                self.post_message(SshProgress(i, SshState.ERROR, error=str(r), fix=connection_fix(r)))
            else:
                self.post_message(SshProgress(i, SshState.CONNECTED, host_key=api.host_key(r)))
        self.post_message(ActionDone("ssh"))

    def on_ssh_progress(self, msg: SshProgress) -> None:
        ns = self.state.node(msg.index)
        ns.fix = msg.fix
        if msg.state == SshState.ERROR:
            changed = "HOST KEY CHANGED" in (msg.error or "")
            ns.ssh_failed(msg.error or "", refused=changed)
            if changed:
                ns.host_key = "CHANGED: refused"
        else:
            ns.ssh, ns.ssh_error = msg.state, ""
            if msg.host_key:
                ns.host_key = msg.host_key
        self.refresh_all()

    def on_action_done(self, msg: ActionDone) -> None:
        if msg.error:
            self.notify(msg.error, severity="error", title=msg.action)
        self.wizard.facts_changed()

    # ---------------------------------------------------------------- keys
    def action_install_key(self) -> None:
        if self.slurm_says():
            return
        if all(n.is_local for n in self.state.preset.cluster.nodes):
            self.notify("every node is this machine: nothing to install")
            return

        def got(pw: str | None) -> None:
            if pw is None:
                return
            self.wizard.password = pw  # memory only: never in the preset, a log or the screen
            self.install_key()

        if self.wizard.password is not None:
            self.install_key()
        else:
            self.app.push_screen(PasswordPrompt("Password for the nodes",
                                                "Asked once, kept in memory only, used to install the key."), got)

    @work(thread=True, exclusive=True, exit_on_error=False, group="ssh")
    def install_key(self) -> None:
        st = self.state
        ident = os.path.expanduser(st.preset.cluster.identity_file) if st.preset.cluster.identity_file else None
        rep = api.setup_keys(st.preset, self.wizard.password, identity=ident, consent=self.wizard.ask_host_key)
        self.app.call_from_thread(self._keys_done, rep)

    def _keys_done(self, rep) -> None:
        self.state.key_report = rep
        for i, v in rep.installed.items():
            if isinstance(v, BaseException):
                self.state.node(i).ssh_failed(str(v))
            else:
                self.state.node(i).ssh, self.state.node(i).ssh_error = SshState.KEY_INSTALLED, ""
        self.notify(key_summary(rep, self.state.preset), severity="information" if rep.ok else "error",
                    title="SSH keys")
        self.wizard.facts_changed()

    def action_verify_pairs(self) -> None:
        if self.slurm_says():
            return
        self.action_install_key()  # setup_keys is idempotent and ends with the all-pairs matrix
