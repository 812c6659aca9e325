"""What every step screen shares: the stepper on top, the footer with its keys, and
`refresh_state()` called whenever the App's state changes."""

from __future__ import annotations

from typing import Callable, Optional

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from ...nodes.results import NodeResults
from ...wizard_state import STEPS, WizardState
from ..messages import StateChanged
from ..widgets.stepper import Stepper
from ..wizard import Wizard


class StepScreen(Screen):
    STEP = ""
    HELP = ""

    @property
    def wizard(self) -> Wizard:
        return self.app  # type: ignore[return-value]  (a WizardApp: app.py is not imported here)

    @property
    def state(self) -> WizardState:
        return self.wizard.state

    def compose(self) -> ComposeResult:
        yield Stepper(id="stepper")
        with Vertical(id="body"):
            yield from self.body()
        yield Footer(compact=True)

    def body(self) -> ComposeResult:
        raise NotImplementedError

    def on_mount(self) -> None:
        self.refresh_all()

    def on_screen_resume(self) -> None:
        self.refresh_all()

    def on_worker_state_changed(self, ev: Worker.StateChanged) -> None:
        if ev.state == WorkerState.ERROR:  # StateChanged does not bubble: hand it to the App
            self.wizard.worker_failed(ev.worker)

    def on_state_changed(self, _: StateChanged) -> None:
        self.refresh_all()

    def refresh_all(self) -> None:
        st = self.state
        name = st.preset.name or (st.path.stem if st.path else "new preset")
        title = f"qwen-tui · {name}{' *' if st.dirty else ''}"
        self.query_one(Stepper).show(self.STEP, {s: st.step_status(s) for s in STEPS}, title)
        self.refresh_state()

    def change(self, path: str, value) -> None:
        """Ask the App to set one preset field, unless it already holds that value
        (inputs fire Changed when they are filled from the preset)."""
        from ..messages import ChangePreset

        try:
            same = self.state.preset.get_path(path) == value
        except (AttributeError, IndexError, KeyError):
            same = False
        if not same:
            self.post_message(ChangePreset({path: value}))

    def refresh_state(self) -> None:
        """Redraw this screen from `self.state`."""

    def connect_nodes(self, indices: Optional[list[int]] = None,
                      on_progress: Optional[Callable[[int, str], None]] = None) -> NodeResults:
        """Connect the preset's nodes through the wizard's Connections (run.api), asking the
        person about a new host key; node -> Transport | exception. Call it from a worker."""
        w = self.wizard
        return w.state.conns.connect(w.state.preset, indices, consent=w.ask_host_key, password=w.password,
                                     on_progress=on_progress)
