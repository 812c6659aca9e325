"""The wizard's App: wiring only. It owns the wizard's state (qwen_tui.wizard.state: the
one in-memory Preset, its facts and connections), applies the changes screens ask for
through Preset.with_changes, and switches between steps. Each step lives in its own
file under screens/."""

from __future__ import annotations

import concurrent.futures as cf
import os
import sys
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen
from textual.worker import Worker

from ..advice.rules import Advice, apply_fix
from ..base.field_words import plain_message
from ..cluster.facts import ClusterFacts
from ..preset.files import save_preset
from ..preset.lenient import load_preset_keeping_known
from ..preset.schema import Preset, PresetError
from ..run.api import CONSENT_WAIT_S
from ..wizard.state import STEPS, TITLES, WizardState, new_preset
from .launch_guard import LaunchGuard
from .messages import ChangePreset, StateChanged
from .modals import Confirm, Form, Notice, host_key_question
from .screens.base import MIN_SIZE


def _screens() -> dict[str, Any]:
    from .screens.network import NetworkScreen
    from .screens.nodes import NodesScreen
    from .screens.review import ReviewScreen
    from .screens.run import RunScreen
    from .screens.ssh import SSHScreen
    from .screens.training import TrainingScreen

    return {"nodes": NodesScreen, "ssh": SSHScreen, "network": NetworkScreen, "training": TrainingScreen,
            "review": ReviewScreen, "run": RunScreen}


class WizardApp(App[int]):
    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses elsewhere still find it
    TITLE = "qwen-tui"
    BINDINGS = [
        # the stepper on top shows F1..F6 with each step's state: the footer keeps its room for the rest
        *[Binding(f"f{i + 1}", f"goto('{s}')", TITLES[s], show=False) for i, s in enumerate(STEPS)],
        Binding("ctrl+s", "save", "Save"),
        Binding("ctrl+o", "open", "Open"),
        Binding("f10", "help", "Help", show=False),  # each step shows it first in its footer (StepScreen)
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]
    # Below 100 columns or 30 rows the steps reflow (app.tcss: Screen.-narrow, Screen.-short); below the
    # minimum (MIN_SIZE) a step shows a "terminal too small" notice instead of a clipped screen.
    HORIZONTAL_BREAKPOINTS = [(0, "-tiny-w"), (MIN_SIZE[0], "-narrow"), (100, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-tiny-h"), (MIN_SIZE[1], "-short"), (30, "-tall")]

    def __init__(self, preset_path: str | None = None, *, preset: Preset | None = None,
                 facts: ClusterFacts | None = None, runs_root: str | None = None,
                 reattach: bool = True, base_dir: str | None = None,
                 local_python: str | None = None) -> None:
        super().__init__()
        self.load_error: str | None = None
        self.unknown_keys: list[str] = []  # the opened file's keys qwen-tui does not know (left out, file kept)
        path = Path(preset_path) if preset_path else None
        self.new_path = False  # a path that names no file yet: a new preset that ctrl+s saves there
        if preset is None and path is not None:
            if not os.path.lexists(path):
                self.new_path = True
                if path.stem.isprintable():  # named after its file, as its saved header will be
                    preset = new_preset().with_changes({"name": path.stem})
            else:
                try:
                    preset, self.unknown_keys = load_preset_keeping_known(path)
                except PresetError as e:
                    self.load_error = str(e)
                    # ctrl+s must not write the defaults over the file that failed to open
                    path = None
        self.state = WizardState(preset=preset or new_preset(), path=path, facts=facts or ClusterFacts())
        self.state.recompute()
        self.runs_root = Path(runs_root).absolute() if runs_root else None
        self.reattach = reattach
        self.base_dir = base_dir or os.getcwd()  # relative local workdirs resolve against it
        # Local nodes without a python of their own run this one: Review shows it, launch uses it.
        self.local_python = local_python or sys.executable
        self.password: str | None = None  # asked once in the SSH step; memory only
        self.launch_guard = LaunchGuard(self)  # the questions before a launch (Review's l, the Run step's l)
        self.quit_note: str | None = None  # said on the terminal once the wizard has gone: a run it leaves going

    # ---------------------------------------------------------------- start
    def on_mount(self) -> None:
        # the steps' texts take their colours from the theme when drawn (ui/styles.py): draw them again in a new one
        self.theme_changed_signal.subscribe(self, lambda _: self.screen.post_message(StateChanged()))
        for name, cls in _screens().items():
            self.install_screen(cls(), name)
        self.push_screen("nodes")
        if self.load_error:
            self.push_screen(Notice("The preset could not be opened", self.load_error + "\n\nThe wizard starts "
                                    "from a new preset; ctrl+s asks where to save it (the file above is left "
                                    "as it is)."))
        elif self.unknown_keys:
            self._say_unknown_keys()
        elif self.new_path:
            self.notify(f"{self.state.path} does not exist yet: a new preset; ctrl+s saves it there",
                        title="New preset")
        if self.reattach:
            self.call_after_refresh(self._reattach_if_running)

    def _say_unknown_keys(self) -> None:
        self.push_screen(Notice("Keys qwen-tui does not know", "\n".join(self.unknown_keys) + "\n\nThe rest of the "
                                "preset is open. The file is left as it is: fix the key there and open it again "
                                "(ctrl+o), or go on here; saving over the file asks first, since those lines "
                                "would go."))

    def _reattach_if_running(self) -> None:
        from ..run.rundir import default_runs_root, find_running

        rd = find_running(self.runs_root or default_runs_root())
        if rd is not None:
            self.notify(f"re-attaching to the running job in {rd.path}", title="Run")
            self.action_goto("run")
            self.get_screen("run").attach(rd)

    # ---------------------------------------------------------------- state
    def on_change_preset(self, msg: ChangePreset) -> None:
        try:
            new = self.state.preset.with_changes(msg.changes)
        except (PresetError, KeyError, IndexError) as e:
            errors = getattr(e, "field_errors", [])
            for path, value in msg.changes.items():
                why = "; ".join(plain_message(f.message) for f in errors
                                if f.path == path or f.path.startswith(path + "."))
                self.state.field_errors[path] = (value, why or str(e))
            screen = self.shown_screen()
            if hasattr(screen, "show_field_errors"):
                screen.show_field_errors(errors, msg.changes)
            elif screen is not None:
                self.notify(str(e), severity="error", title="Not applied")
            if screen is not None:
                screen.post_message(StateChanged())  # the stepper marks the step
            return
        refused = [path for path in msg.changes if self.state.field_errors.pop(path, None) is not None]
        screen = self.shown_screen()
        if hasattr(screen, "show_field_errors"):
            screen.show_field_errors([], msg.changes)
        if new == self.state.preset:
            # the screens ask for every edit, in the order typed (a field filled from the preset too): one
            # that changes nothing leaves the preset clean, and only a refusal it takes back is news
            if refused and screen is not None:
                screen.post_message(StateChanged())
            return
        self.set_preset(new, note=msg.note)

    def shown_screen(self) -> Screen | None:
        """The screen on top, or None once the App has closed its screens: a form's last change (a field's blur as
        the App quits) can arrive after them, and is then only recorded."""
        return self.screen_stack[-1] if self.screen_stack else None

    def set_preset(self, preset: Preset, *, note: str | None = None, dirty: bool = True) -> None:
        old_nodes = self.state.preset.cluster.nodes
        self.state.preset = preset
        self.state.dirty = self.state.dirty or dirty
        def where(nodes):
            return [(n.host, n.user, n.port) for n in nodes]

        if where(preset.cluster.nodes) != where(old_nodes):
            self.forget_connections()
        self.facts_changed()
        if note:
            self.notify(note)

    def facts_changed(self) -> None:
        self.state.recompute()
        screen = self.shown_screen()
        if screen is not None:
            screen.post_message(StateChanged())

    def forget_connections(self) -> None:
        """Nodes changed: connections and per-node checks no longer describe them."""
        self.state.conns.close()
        self.state.nodes.clear()
        self.state.facts = ClusterFacts(links={}, master_port_free=self.state.facts.master_port_free)

    # ---------------------------------------------------------------- connections (worker threads)
    def ask_host_key(self, label: str, host: str, key: Any) -> bool:
        """Consent callback for a new host key, called on a connecting thread: shows a
        modal on the UI thread and waits (bounded) for the answer."""
        from ..nodes.transport.hostkeys import fingerprint

        answer: cf.Future = cf.Future()
        q = host_key_question(label, host, key.get_name(), fingerprint(key))
        self.call_from_thread(self.push_screen, q, answer.set_result)
        try:
            return bool(answer.result(timeout=CONSENT_WAIT_S))
        except cf.TimeoutError:
            return False

    # ---------------------------------------------------------------- fixes, help, palette
    def apply_fix(self, item: Advice) -> bool:
        """Apply an advice item's fix. A fix that changes nothing in the preset (an instruction: install,
        open a port) is shown as what to do, never announced as applied. True when the preset changed."""
        fix = item.fix
        changes = dict(fix.changes) if fix is not None else {}
        if not changes:
            hint = fix.hint if fix is not None else None
            label = fix.label if fix is not None else ""
            what = f"{label}: {hint}" if hint else label or "This finding has no automatic fix."
            self.push_screen(Notice(f"{item.code}: to do by hand", f"{item.message}\n\n{what}\n\n"
                                    "qwen-tui cannot do this from the preset; the finding goes once it is done "
                                    "(probe or check again)."))
            return False
        try:
            new = apply_fix(self.state.preset, fix)
        except (ValueError, KeyError, PresetError) as e:
            self.notify(str(e), severity="error", title="Fix not applied")
            return False
        self.set_preset(new, note=f"applied: {fix.label}")
        return True

    def action_help(self) -> None:
        from .help import STEP_HELP, HelpPanel

        screen = self.screen
        if screen.is_modal:
            return
        step = getattr(screen, "STEP", "")
        body = getattr(screen, "HELP", "") or STEP_HELP.get(step, "")
        keys = [b for b in type(screen).BINDINGS if isinstance(b, Binding)]
        self.push_screen(HelpPanel(TITLES.get(step, "qwen-tui"), body, keys))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The command palette (ctrl+p): the wizard's steps, every key any step's footer offers (so
        "launch", "probe", "stop", "data" find their step's action), its own help as "Keys", and
        Textual's theme and screenshot. Textual's "Keys" (the focused widget's bindings) is left out."""
        for cmd in super().get_system_commands(screen):
            if cmd.title not in ("Keys", "Quit"):  # ours below: the wizard's keys; quit that asks first
                yield cmd
        yield SystemCommand("Keys", "every key of this step and the wizard's (F10 or ?)",
                            self.action_help)
        yield SystemCommand("Quit", "ctrl+q: leave qwen-tui (a run keeps running; reopening re-attaches)",
                            self.action_quit)
        for i, step in enumerate(STEPS):
            yield SystemCommand(f"Go to step {i + 1}: {TITLES[step]}", f"F{i + 1}", partial(self.action_goto, step))
        steps = _screens()
        for i, step in enumerate(STEPS):
            for b in steps[step].BINDINGS:
                if isinstance(b, Binding) and b.show and b.description and not b.action.startswith("app."):
                    key = b.key_display or b.key.split(",")[0]
                    yield SystemCommand(f"{TITLES[step]}: {b.description}", f"key {key} on step {i + 1} "
                                        f"(F{i + 1})", partial(self._run_step_action, step, b.action))
        yield SystemCommand("Help for this step", "F10 or ?", self.action_help)
        yield SystemCommand("Open preset", "ctrl+o: load a preset YAML file", self.action_open)
        yield SystemCommand("Save preset", "ctrl+s: write the preset to its file", self.action_save)
        yield SystemCommand("Save preset as", "write the preset to a new file", self.action_save_as)
        for a in self.state.advice:
            if a.fix is not None:
                yield SystemCommand(f"Apply fix: {a.fix.label}", f"{a.code}: {a.message}",
                                    partial(self._fix_from_palette, a))

    def _run_step_action(self, step: str, action: str) -> None:
        """A footer key chosen from the palette: go to its step, then act there as the key would."""
        if self.screen.is_modal:
            return
        if getattr(self.screen, "STEP", "") != step:
            self.switch_screen(step)
        self.call_after_refresh(lambda: self.run_action(action, self.get_screen(step)))

    def _fix_from_palette(self, item: Advice) -> None:
        if self.apply_fix(item) and hasattr(self.screen, "fill_from_preset"):
            self.screen.fill_from_preset()

    # ---------------------------------------------------------------- actions
    def action_goto(self, step: str) -> None:
        if self.screen.is_modal:
            return
        self.switch_screen(step)

    def action_save(self) -> None:
        if self.state.path is None:
            self.action_save_as()
            return
        self._save_to({"path": str(self.state.path)})

    def action_save_as(self) -> None:
        default = str(self.state.path or f"presets/{self.state.preset.name or 'my-run'}.yaml")
        self.push_screen(Form("Save preset as", [("path", "file", default)], paths=["path"]), self._save_to)

    def _save_to(self, answer: dict[str, Any] | None, *, old_values_ok: bool = False) -> None:
        if not answer or not answer.get("path"):
            return
        if self.state.field_errors and not old_values_ok:
            bad = "\n".join(f"  {p}: {v!r} ({why})" for p, (v, why) in self.state.field_errors.items())
            self.push_screen(Confirm("Save with the old values?",
                                     f"These fields hold values that were not accepted:\n{bad}\n\nThe preset still "
                                     "has their previous values; saving now writes those. No goes back to fix them.",
                                     yes="Save old values", no="Go back"),
                             lambda yes: self._save_to(answer, old_values_ok=True) if yes else None)
            return
        path = Path(os.path.expanduser(answer["path"]))
        if self.unknown_keys and self.state.path is not None and path.absolute() == self.state.path.absolute() \
                and not answer.get("unknown_ok"):
            self.push_screen(Confirm("Save over a file with unknown keys?",
                                     "\n".join(self.unknown_keys) + f"\n\nSaving writes the preset to {path} "
                                     "without these lines. No goes back: fix the key in the file and open it again, "
                                     "or save under another name (ctrl+p: Save preset as).",
                                     yes="Save without them", no="Go back", danger=True),
                             lambda yes: self._save_to({**answer, "unknown_ok": True}, old_values_ok=True)
                             if yes else None)
            return
        try:
            save_preset(self.state.preset, path)
        except (OSError, PresetError) as e:
            self.push_screen(Notice("Not saved", str(e)))
            return
        if self.state.path is None or path.absolute() == self.state.path.absolute():
            self.unknown_keys = []  # written without them: the file now reads as it is shown
        self.state.path, self.state.dirty = path, False
        self.notify(f"saved {path}", title="Preset")
        self.screen.post_message(StateChanged())

    def action_open(self) -> None:
        def ask_path(yes: bool | None = True) -> None:
            if yes:
                self.push_screen(Form("Open preset", [("path", "file", str(self.state.path or "presets/"))],
                                      paths=["path"]), self._open)

        if self.state.dirty:  # opening replaces the preset in memory: its edits would be gone
            self.push_screen(Confirm("Open another preset?", "This preset has unsaved changes; opening another "
                                     "drops them (no: go back, ctrl+s saves them).", yes="Drop and open",
                                     danger=True), ask_path)
            return
        ask_path()

    def _open(self, answer: dict[str, Any] | None) -> None:
        if not answer:
            return
        path = Path(os.path.expanduser(answer["path"]))
        try:
            preset, unknown = load_preset_keeping_known(path)
        except PresetError as e:
            self.push_screen(Notice("The preset could not be opened", str(e)))
            return
        self.state.path, self.unknown_keys = path, unknown
        self.state.forget_results()  # probe, SSH and network results were the previous preset's
        self.set_preset(preset, dirty=False)
        self.state.dirty = False
        self.notify(f"opened {path}", title="Preset")
        if unknown:
            self._say_unknown_keys()

    def running_run_id(self) -> str | None:
        """The run this wizard follows while it trains (or starts), else None."""
        from ..run.states import RunState

        launcher = getattr(self.get_screen("run"), "launcher", None) if "run" in self._installed_screens else None
        if launcher is None or self.state.run_status not in (RunState.RUNNING, RunState.STARTING):
            return None
        return str(launcher.plan.run_id)

    def _quit(self) -> None:
        run_id = self.running_run_id()
        if run_id:  # quitting detaches: say so where the user will look next, the terminal
            self.quit_note = (f"the run {run_id} goes on without the wizard:\n"
                              f"  qwen-tui attach {run_id}          follows it (reopening qwen-tui does too)\n"
                              f"  qwen-tui attach {run_id} --stop   stops it")
        self.exit(0)

    async def action_quit(self) -> None:
        if self.state.dirty:
            def done(yes: bool | None) -> None:
                if yes:
                    self._quit()
            self.push_screen(Confirm("Quit without saving?",
                                     "The preset has unsaved changes (ctrl+s saves). A running job keeps "
                                     "running either way; reopening qwen-tui re-attaches."), done)
            return
        self._quit()

    # ---------------------------------------------------------------- launch
    def launch_asking(self, *, ask_errors: bool = True) -> None:
        """Review's l and the Run step's l: the launch guard looks at node 0, asks, then launches."""
        self.launch_guard.launch_asking(ask_errors=ask_errors)

    def on_worker_state_changed(self, ev: Worker.StateChanged) -> None:
        self.launch_guard.worker_changed(ev)  # its look at node 0 runs in the App's worker

    # ---------------------------------------------------------------- errors and teardown
    def worker_failed(self, worker: Worker) -> None:
        """Workers run with exit_on_error=False: their errors land here (via the
        screen that owns them), never crash the app."""
        from ..cluster.failures import describe_exception
        from ..nodes.keys import KeyLocked
        from ..nodes.transport.protocol import TransportError

        err = worker.error
        if isinstance(err, (TransportError, PresetError, KeyLocked, OSError)):
            # about the preset, this machine or a node (a missing ssh_config, a locked key): say what, not "bug"
            self.push_screen(Notice(f"{worker.name}: could not finish", f"{type(err).__name__}: {err}\n\n"
                                    "This is about the preset, this machine or the nodes, not a bug in qwen-tui: "
                                    "fix what it names and try again. Nothing was lost."))
            return
        self.push_screen(Notice(f"Internal error: {worker.name} failed", describe_exception(err) + (
            "\n\nThis is a bug in qwen-tui, not a problem with the preset or the nodes; please report it with "
            "this text. Nothing was lost: a job that had started keeps running, and reopening qwen-tui "
            "re-attaches to it.")))

    def on_unmount(self) -> None:
        from .screens.run import RunScreen  # installed in on_mount: imported by then

        run = self.get_screen("run") if "run" in self._installed_screens else None
        if isinstance(run, RunScreen) and run.monitor is not None:
            run.monitor.stop()
        self.state.conns.close()


def run_app(preset_path: str | None = None) -> int:
    app = WizardApp(preset_path)
    rc = app.run()
    if app.quit_note:
        print(app.quit_note)
    return int(rc or 0)
