"""Step 1, Nodes: the machines of the run. Add, edit, remove, import a hostfile /
SLURM node list / ~/.ssh/config, and probe them all in parallel; or (k) let SLURM give them, and say what to ask
it for (slurm_nodes.py)."""

from __future__ import annotations

import os
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Label, Static

from ...base.field_words import plain
from ...nodes import hostlists
from ...nodes.transport.sshconfig import ssh_config_import_text
from ...preset.schema import PresetError
from ...run import api
from ...wizard.state import NodeStatus, ProbeState, connection_fix, finding_line
from ..messages import ActionDone, ChangePreset, ProbeProgress
from ..modals import Choose, Confirm, Form, ImportNodes, Notice
from ..styles import FAIL, GOOD, WARNING, level_style, tone
from . import slurm_nodes
from .base import StepScreen

_NODE_FIELDS = [("host", "host"), ("user", "user"), ("port", "port"), ("gpus", "GPUs (processes)"),
                ("workdir", "workdir"), ("python", "python"), ("name", "label")]
_LABELS = dict(_NODE_FIELDS)


def _whole(lo: int, hi: int, empty_ok: bool = True):
    def check(text: str) -> str:
        if not text:
            return "" if empty_ok else "is required"
        if not text.isdigit() or not lo <= int(text) <= hi:
            return f"must be a whole number from {lo} to {hi}, got {text!r}"
        return ""
    return check


def _path_check(text: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        return "holds a control character"
    return "holds a space at its start or end" if text != text.strip() else ""


def _user_check(text: str) -> str:
    if any(c.isspace() or c in "@:/" for c in text):
        return f"{text!r} is not a user name (no spaces, @, : or /)"
    return ""


# what the node form checks as it is typed, before any connection is tried
NODE_CHECKS = {"host": lambda t: hostlists.host_problem(t) if t else "is required", "user": _user_check,
               "port": _whole(1, 65535), "gpus": _whole(1, 64), "workdir": _path_check, "python": _path_check}


def _status_text(ns: NodeStatus) -> Text:
    if ns.probe == ProbeState.OK:
        return Text("✔ probed", style=tone(GOOD))
    if ns.probe == ProbeState.ERROR:
        return Text(f"✘ {ns.probe_error.strip()[:60]}", style=tone(FAIL))
    if ProbeState(ns.probe).busy:
        return Text(f"… {ns.probe}", style=tone(WARNING))
    return Text(ns.probe, style="dim")


class NodesScreen(StepScreen):
    STEP = "nodes"
    BINDINGS = [
        Binding("a", "add", "Add"),
        Binding("e,enter", "edit", "Edit"),
        Binding("delete,x", "remove", "Remove"),
        Binding("i", "import_nodes", "Import"),
        Binding("p", "probe", "Probe"),
        Binding("k", "kind", "SSH/SLURM", show=False),  # said in the intro: the footer keeps Quit at 80 columns
    ]

    def body(self) -> ComposeResult:
        yield Label("Nodes: the machines of this run. Node 0 is the master (this machine runs qwen-tui). "
                    "k: let SLURM give them instead.",
                    classes="intro")
        yield DataTable(id="nodes-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="slurm-summary")
        yield Static(id="findings")

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        t.add_columns("#", "host", "user", "port", "GPUs", "GPU model", "status")
        super().on_mount()

    @property
    def slurm(self) -> bool:
        return self.state.preset.scheduler.is_slurm

    def refresh_state(self) -> None:
        st = self.state
        t = self.query_one(DataTable)
        t.display = not self.slurm
        self.query_one("#slurm-summary", Static).display = self.slurm
        if self.slurm:
            self.query_one("#slurm-summary", Static).update(slurm_nodes.summary(st.preset))
            self.query_one("#findings", Static).update("")
            return
        row = t.cursor_row
        t.clear()
        for i, n in enumerate(st.preset.cluster.nodes):
            nf = st.node_facts(i)
            model = (nf.gpu_model or ("CPU only" if nf.gpus == [] else "?")) if nf else "?"
            found = "" if not nf or nf.gpu_count is None else f" ({nf.gpu_count} seen)"
            t.add_row(str(i), n.label if n.name else n.host, n.user or "(ssh default)", str(n.port),
                      f"{n.gpus}{found}", model, _status_text(st.node(i)), key=str(i))
        if row is not None and t.row_count:
            t.move_cursor(row=min(row, t.row_count - 1))
        lines = Text()
        labels = [n.label for n in st.preset.cluster.nodes]
        for f in st.findings:
            lines.append(finding_line(f, labels) + "\n", style=level_style(f.level))
            if f.fix:
                lines.append(f"    fix: {f.fix}\n", style="dim")
        for i, n in enumerate(st.preset.cluster.nodes):
            ns, nf = st.node(i), st.node_facts(i)
            err = ns.probe_error if ns.probe == ProbeState.ERROR else (nf.error if nf else None)
            if err:  # in full (the table's column is cut), with the node's number and host once
                lines.append(f"✘ node {i} ({n.label}): {err}\n", style=tone(FAIL))
                if ns.fix:
                    lines.append(f"    fix: {ns.fix}\n", style="dim")
        if not lines:
            lines = Text("No findings across nodes yet: probe (p) checks GPUs, versions, data and disk on every node.",
                         style="dim")
        self.query_one("#findings", Static).update(lines)

    # ---------------------------------------------------------------- edit
    def _node_dicts(self) -> list[dict[str, Any]]:
        return [n.model_dump(exclude_defaults=True) for n in self.state.preset.cluster.nodes]

    def _form(self, title: str, initial: dict[str, Any], index: int | None, error: str = "") -> None:
        fields = [(k, label, "" if initial.get(k) is None else str(initial[k])) for k, label in _NODE_FIELDS]

        def done(ans: dict[str, Any] | None) -> None:
            if ans is None:
                return
            node = {k: v.strip() for k, v in ans.items() if v.strip()}
            nodes = self._node_dicts()
            if index is None:
                nodes.append(node)
            else:
                nodes[index] = node
            try:
                self.state.preset.with_changes({"cluster.nodes": nodes})
            except PresetError as e:  # show the form again, with the problem next to it, in plain words
                errs = getattr(e, "field_errors", [])
                words = "\n".join(plain(f.path, f.message, labels=_LABELS) for f in errs) or str(e)
                self._form(title, ans, index, error=words)
                return
            self.post_message(ChangePreset({"cluster.nodes": nodes}))

        self.app.push_screen(Form(title, fields, error, checks=NODE_CHECKS), done)

    def _not_with_slurm(self) -> bool:
        if self.slurm:
            self.notify("SLURM gives this run its nodes: e edits what to ask it for, k switches to SSH nodes",
                        severity="warning")
        return self.slurm

    def action_kind(self) -> None:
        p = self.state.preset

        def answer(kind: str | None) -> None:
            if kind is None or (kind == "slurm") == self.slurm:
                return
            changes = slurm_nodes.to_slurm(p) if kind == "slurm" else slurm_nodes.to_ssh(p)
            self.post_message(ChangePreset(changes, note="SLURM gives the nodes" if kind == "slurm"
                                           else "nodes over SSH (this machine first: add the others)"))

        self.app.push_screen(Choose("Who gives the nodes?", "SSH nodes: the machines you list, reached over SSH. "
                                    "SLURM: the nodes SLURM gives (a batch job submitted from here, or the "
                                    "allocation qwen-tui runs in), reached through srun.",
                                    [("ssh", "SSH nodes", "s"), ("slurm", "SLURM", "l")]), answer)

    def _slurm_form(self, initial: dict[str, str] | None = None, error: str = "") -> None:
        fields = slurm_nodes.form_fields(self.state.preset)
        if initial is not None:
            fields = [(k, label, initial.get(k, v)) for k, label, v in fields]

        def done(ans: dict[str, Any] | None) -> None:
            if ans is None:
                return
            changes = slurm_nodes.changes_of(ans)
            try:
                self.state.preset.with_changes(changes)
            except PresetError as e:
                errs = getattr(e, "field_errors", [])
                words = "\n".join(plain(f.path, f.message, labels=slurm_nodes.LABELS) for f in errs) or str(e)
                self._slurm_form(ans, error=words)
                return
            self.post_message(ChangePreset(changes))

        self.app.push_screen(Form("What to ask SLURM for", fields, error), done)

    def action_add(self) -> None:
        if self._not_with_slurm():
            return
        # as many GPUs as the nodes already there (the last one's): a new node of a cluster is usually alike
        gpus = self.state.preset.cluster.nodes[-1].gpus
        self._form("Add node", {"host": "", "port": 22, "gpus": gpus}, None)

    def action_edit(self) -> None:
        if self.slurm:
            self._slurm_form()
            return
        i = self.query_one(DataTable).cursor_row
        if i is None or i >= len(self.state.preset.cluster.nodes):
            return
        node = self.state.preset.cluster.nodes[i]
        initial = node.model_dump()
        if "python" not in node.model_fields_set:  # "python3" in the form would pin it: a local node runs ours
            initial["python"] = None
        self._form(f"Edit node {i}", initial, i)

    def action_remove(self) -> None:
        if self._not_with_slurm():
            return
        i = self.query_one(DataTable).cursor_row
        nodes = self._node_dicts()
        if len(nodes) <= 1:
            self.notify("a run needs at least one node", severity="warning")
            return
        if i is None or i >= len(nodes):
            return
        node = self.state.preset.cluster.nodes[i]
        where = f"{node.user + '@' if node.user else ''}{node.host}:{node.port}"

        def done(yes: bool | None) -> None:
            if yes:
                del nodes[i]
                self.post_message(ChangePreset({"cluster.nodes": nodes}, note=f"removed node {i} ({node.label})"))

        self.app.push_screen(Confirm(f"Remove node {i}?", f"{node.label} ({where}, {node.gpus} GPU(s)) leaves the "
                                     "run; its probe results go with it. ctrl+o reopens the saved preset to get it "
                                     "back.", yes="Remove", danger=True), done)

    def action_import_nodes(self) -> None:
        if self._not_with_slurm():
            return
        cfg = os.path.expanduser(self.state.preset.cluster.ssh_config or "~/.ssh/config")
        text = ""
        if os.path.exists(cfg):
            try:  # with its Includes expanded: hosts defined in included files are offered too
                text = ssh_config_import_text(cfg)
            except ValueError as e:
                self.notify(str(e), severity="warning")

        def done(ans: tuple[str, str] | None) -> None:
            if not ans:
                return
            kind, body = ans
            try:
                new = hostlists.parse(kind, body)
            except ValueError as e:
                self.app.push_screen(Notice("Nothing imported", f"{e}\n\nFix these lines and import again (i); "
                                            "the nodes are as they were."))
                return
            self._replace_or_append(kind, new)

        self.app.push_screen(ImportNodes(text), done)

    def _replace_or_append(self, kind: str, new: list[dict[str, Any]]) -> None:
        """The import never drops the nodes there without asking: replace them, or add the new ones after."""
        have = self.state.preset.cluster.nodes
        listed = ", ".join(f"{n['host']} ({n.get('gpus', 1)} GPU(s))" for n in new[:6]) + \
            (f" and {len(new) - 6} more" if len(new) > 6 else "")

        def answer(how: str | None) -> None:
            if how is None:
                return
            nodes = new if how == "replace" else self._node_dicts() + new
            try:
                self.state.preset.with_changes({"cluster.nodes": nodes})
            except PresetError as e:
                errs = getattr(e, "field_errors", [])
                why = "\n".join(plain(f.path, f.message, labels=_LABELS) for f in errs) or str(e)
                self.app.push_screen(Notice("Nothing imported", f"{why}\n\nThe nodes are as they were."))
                return
            verb = "replaced the nodes with" if how == "replace" else "added"
            self.post_message(ChangePreset({"cluster.nodes": nodes}, note=f"{verb} {len(new)} node(s) from a {kind}"))

        self.app.push_screen(Choose(f"Import {len(new)} node(s)", f"From the {kind}: {listed}.\n\nThe preset has "
                                    f"{len(have)} node(s) now ({', '.join(n.label for n in have[:6])}). Replace "
                                    "them (node 0, the master, becomes the first imported one), or add the imported "
                                    "ones after them?",
                                    [("replace", "Replace", "r"), ("append", "Add after", "a")]), answer)

    # ---------------------------------------------------------------- probe
    def action_probe(self) -> None:
        if self._not_with_slurm():
            return
        for i in range(len(self.state.preset.cluster.nodes)):
            self.state.node(i).probe = ProbeState.CONNECTING
        self.refresh_all()
        self.probe_all()

    @work(thread=True, exclusive=True, exit_on_error=False, group="probe")
    def probe_all(self) -> None:
        import concurrent.futures as cf

        preset = self.state.preset
        conns = self.connect_nodes(on_progress=lambda i, s: self.post_message(ProbeProgress(i, ProbeState(s))))

        def one(i: int) -> None:
            t = conns.get(i)
            if isinstance(t, BaseException) or t is None:
                # the whole message and its fix: this is where a new user first meets an SSH failure
                self.post_message(ProbeProgress(i, ProbeState.ERROR, error=f"cannot log in: {t}",
                                                fix=connection_fix(t) if t is not None else "",
                                                connection_failed=True))
                return
            self.post_message(ProbeProgress(i, ProbeState.PROBING))
            try:
                nf = api.probe(preset, t, i, local_python=self.wizard.local_python)
            except Exception as e:  # one node's failure is that node's row, not the app's
                self.post_message(ProbeProgress(i, ProbeState.ERROR, error=f"{type(e).__name__}: {e}"))
                return
            self.post_message(ProbeProgress(i, ProbeState.ERROR if nf.error else ProbeState.OK, facts=nf,
                                            error=nf.error))

        n = len(preset.cluster.nodes)
        with cf.ThreadPoolExecutor(max_workers=max(1, n)) as ex:
            list(ex.map(one, range(n)))
        self.post_message(ActionDone("probe"))

    def on_probe_progress(self, msg: ProbeProgress) -> None:
        st = self.state
        ns = st.node(msg.index)
        if msg.state == ProbeState.ERROR:
            ns.probe_failed(msg.error or "")
        else:
            ns.probe, ns.probe_error = msg.state, ""
        ns.fix = msg.fix
        if msg.connection_failed:  # the SSH step shows the same state
            ns.ssh_failed((msg.error or "").removeprefix("cannot log in: "))
        if msg.facts is not None:
            st.facts.nodes[msg.index] = msg.facts
        self.refresh_all()

    def on_action_done(self, msg: ActionDone) -> None:
        if msg.action == "probe":
            self.wizard.facts_changed()
