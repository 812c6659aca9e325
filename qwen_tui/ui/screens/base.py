"""What every step screen shares: the stepper on top, the footer with its keys, and
`refresh_state()` called whenever the App's state changes."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from ..messages import StateChanged
from ..state import STEPS, WizardState
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
        yield Footer()

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
        from .. import core
        from ..messages import ChangePreset

        try:
            same = core.get_path(self.state.preset, path) == value
        except (AttributeError, IndexError, KeyError):
            same = False
        if not same:
            self.post_message(ChangePreset({path: value}))

    def refresh_state(self) -> None:
        """Redraw this screen from `self.state`."""
