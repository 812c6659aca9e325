"""Modal questions: a new host key, a password, stop-all, a node's fields, an
import, a path. Each is a Dialog (ui/dialog.py) and returns its answer through `dismiss`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from .dialog import Dialog
from .widgets.form_inputs import OrderedInput, OrderedSelect, PathInput


class Confirm(Dialog[bool]):
    """Yes/no. `y` / `n` (or Escape) answer from the keyboard."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]
    AUTO_FOCUS = "#yes"  # not the body's scroll: Enter answers, as before the body could scroll

    def __init__(self, title: str, body: str, yes: str = "Yes", no: str = "No", danger: bool = False) -> None:
        super().__init__(title)
        self.body, self.yes, self.no, self.danger = body, yes, no, danger

    def compose_body(self) -> ComposeResult:
        yield self.scrolling(self.text(self.body))

    def compose_buttons(self) -> ComposeResult:
        yield Button(f"{self.yes} (y)", id="yes", variant="error" if self.danger else "primary")
        yield Button(f"{self.no} (n)", id="no")

    def on_button_pressed(self, ev: Button.Pressed) -> None:
        self.dismiss(ev.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


def host_key_question(label: str, host: str, key_type: str, fingerprint: str) -> Confirm:
    return Confirm(f"New host key: {label}",
                   f"{host} offers a host key this machine has never seen:\n\n"
                   f"    {key_type} {fingerprint}\n\n"
                   f"Compare it with the node's own fingerprint (on the node: "
                   f"ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub).\n"
                   f"Accept it and record it in known_hosts?", yes="Accept", no="Refuse")


class Choose(Dialog[str | None]):
    """One of a few answers, each a button with its own key; Escape answers None (go back)."""

    BINDINGS = [Binding("escape", "pick('')", "Cancel")]

    def __init__(self, title: str, body: str, options: list[tuple[str, str, str]]) -> None:
        # options: (answer, button label, key)
        super().__init__(title)
        self.body, self.options = body, options
        self.AUTO_FOCUS = f"#c-{options[0][0]}" if options else None
        for answer, _, key in options:
            self._bindings.bind(key, f"pick('{answer}')", show=False)

    def compose_body(self) -> ComposeResult:
        yield self.scrolling(self.text(self.body))

    def compose_buttons(self) -> ComposeResult:
        for i, (answer, label, key) in enumerate(self.options):
            yield Button(f"{label} ({key})", id=f"c-{answer}", variant="primary" if i == 0 else "default")
        yield Button("Cancel (esc)", id="c-")

    def on_button_pressed(self, ev: Button.Pressed) -> None:
        self.action_pick((ev.button.id or "c-")[2:])

    def action_pick(self, answer: str) -> None:
        self.dismiss(answer or None)


class PasswordPrompt(Dialog[str | None]):
    """Asked once; the answer lives in memory only and is never shown."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, body: str) -> None:
        super().__init__(title)
        self.body = body

    def compose_body(self) -> ComposeResult:
        yield self.text(self.body)
        yield OrderedInput(password=True, placeholder="password", id="password")

    def compose_buttons(self) -> ComposeResult:
        yield Button("OK (enter)", id="ok", variant="primary")
        yield Button("Cancel (esc)", id="cancel")

    def on_input_submitted(self, ev: Input.Submitted) -> None:
        self.dismiss(ev.value)

    def on_button_pressed(self, ev: Button.Pressed) -> None:
        self.dismiss(self.query_one("#password", Input).value if ev.button.id == "ok" else None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class Form(Dialog[dict[str, Any] | None]):
    """A few labelled inputs. Answers {name: text}; the caller validates through the core.
    A field named in `choices` is a select of (label, value) instead (its answer: the value); one named in
    `paths` is a path whose Tab completes it from the files there (PathInput).
    `checks`: name -> a function of the text that says what is wrong with it ("" when nothing), run as it
    is typed: the problem shows under the fields at once, and OK waits until it is fixed."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "ok", "OK")]

    def __init__(self, title: str, fields: list[tuple[str, str, str]], error: str = "",
                 choices: dict[str, list[tuple[str, str]]] | None = None,
                 checks: dict[str, Callable[[str], str]] | None = None,
                 paths: Iterable[str] = ()) -> None:
        # fields: (name, label, initial text)
        super().__init__(title)
        self.fields, self.error = fields, error
        self.choices = choices or {}
        self.checks = checks or {}
        self.paths = set(paths)
        self.problems: dict[str, str] = {}  # what the checks say of the text as it is now
        self.AUTO_FOCUS = f"#f-{fields[0][0]}" if fields else None  # typing goes to the first field

    def compose_body(self) -> ComposeResult:
        # only the fields scroll: the error and OK/Cancel stay in sight in a 30-row terminal
        with self.scrolling(), Grid(classes="form-grid"):
            for name, label, value in self.fields:
                yield Label(label)
                if name in self.choices:
                    yield OrderedSelect(self.choices[name], value=value, allow_blank=False, id=f"f-{name}")
                elif name in self.paths:
                    yield PathInput(value=value, id=f"f-{name}")
                else:
                    yield OrderedInput(value=value, id=f"f-{name}")
        yield Static(self.error, classes="field-error", id="form-error", markup=False)

    def compose_buttons(self) -> ComposeResult:
        yield Button("OK (ctrl+s)", id="ok", variant="primary")
        yield Button("Cancel (esc)", id="cancel")

    def values(self) -> dict[str, Any]:
        return {name: self.query_one(f"#f-{name}", Select if name in self.choices else Input).value
                for name, _, _ in self.fields}

    def on_input_submitted(self, ev: Input.Submitted) -> None:
        self.action_ok()

    def on_input_changed(self, ev: Input.Changed) -> None:
        name = (ev.input.id or "").removeprefix("f-")
        check = self.checks.get(name)
        if check is None:
            return
        why = check(ev.value.strip())
        label = next((lbl for n, lbl, _ in self.fields if n == name), name)
        self.problems.pop(name, None)
        if why:
            self.problems[name] = f"{label}: {why}"
        ev.input.set_class(bool(why), "-invalid")
        self.query_one("#form-error", Static).update("\n".join(self.problems.values()) or self.error)

    def on_button_pressed(self, ev: Button.Pressed) -> None:
        if ev.button.id == "ok":
            self.action_ok()
        else:
            self.dismiss(None)

    def action_ok(self) -> None:
        if self.problems:  # said under the fields already: OK waits for the fix
            self.app.bell()
            return
        self.dismiss(self.values())

    def action_cancel(self) -> None:
        self.dismiss(None)


IMPORT_FORMATS = {
    "hostfile": "One node per line: the host, then slots=N for its GPUs (DeepSpeed/OpenMPI hostfile); "
                "# starts a comment.\nExample:\n  gpu-node-1 slots=8\n  gpu-node-2 slots=8",
    "slurm": "A SLURM node list as $SLURM_JOB_NODELIST or `scontrol show hostnames` prints it; ranges in "
             "brackets expand, zero padding kept.\nExample:\n  gpu[01-04,07],login1",
    "ssh_config": "The Host entries of an ssh_config (wildcards skipped); HostName, User and Port there still "
                  "apply when qwen-tui connects.\nExample:\n  Host gpu1\n    HostName 10.0.0.11\n    User alice",
}


class ImportNodes(Dialog[tuple[str, str] | None]):
    """Paste a hostfile / SLURM node list, or read ~/.ssh/config. Answers (kind, text).
    The accepted format of the chosen kind is shown with an example above the text."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "ok", "Import")]
    WIDE = True

    def __init__(self, ssh_config_text: str = "") -> None:
        super().__init__("Import nodes")
        self.ssh_config_text = ssh_config_text

    def compose_body(self) -> ComposeResult:
        yield OrderedSelect([("hostfile (host slots=N)", "hostfile"), ("SLURM node list", "slurm"),
                             ("~/.ssh/config hosts", "ssh_config")], value="hostfile", allow_blank=False,
                            id="kind")
        yield self.text(IMPORT_FORMATS["hostfile"], id="import-format")
        yield TextArea("", id="text")

    def compose_buttons(self) -> ComposeResult:
        yield Button("Import (ctrl+s)", id="ok", variant="primary")
        yield Button("Cancel (esc)", id="cancel")

    def on_select_changed(self, ev: Select.Changed) -> None:
        self.query_one("#import-format", Static).update(IMPORT_FORMATS.get(str(ev.value), ""))
        if ev.value == "ssh_config" and self.ssh_config_text:
            self.query_one("#text", TextArea).text = self.ssh_config_text

    def on_button_pressed(self, ev: Button.Pressed) -> None:
        if ev.button.id == "ok":
            self.action_ok()
        else:
            self.dismiss(None)

    def action_ok(self) -> None:
        self.dismiss((str(self.query_one("#kind", Select).value), self.query_one("#text", TextArea).text))

    def action_cancel(self) -> None:
        self.dismiss(None)


class Notice(Dialog[None]):
    """An error that needs reading (several lines), not a toast."""

    BINDINGS = [Binding("escape,enter", "close", "Close")]
    AUTO_FOCUS = "#close"
    WIDE = True

    def __init__(self, title: str, body: str) -> None:
        super().__init__(title)
        self.body = body

    def compose_body(self) -> ComposeResult:
        yield self.scrolling(self.text(self.body))

    def compose_buttons(self) -> ComposeResult:
        yield Button("Close (enter)", id="close", variant="primary")

    def on_button_pressed(self, ev: Button.Pressed) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
