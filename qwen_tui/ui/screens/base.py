"""What every step screen shares: the stepper on top, the footer with its keys, and
`refresh_state()` called whenever the App's state changes."""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.events import Resize
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual.widgets._footer import FooterKey
from textual.worker import Worker, WorkerState

from ...run.api import NodeResults
from ...wizard.state import STEPS, WizardState
from ..messages import StateChanged
from ..widgets.stepper import Stepper
from ..wizard import Wizard

MIN_SIZE = (80, 24)  # columns, rows: every step fits from here on (README: "Terminal size")


class StepFooter(Footer):
    """The footer, which in a terminal narrower than 100 columns leaves out ctrl+s and ctrl+o (they still
    work; Help and the palette list them) so that Help, the step's own keys and Quit keep their room."""

    NARROW = 100
    _narrow: bool | None = None

    def compose(self) -> ComposeResult:
        if self._narrow is None:
            self._narrow = self.app.size.width < self.NARROW
        for w in super().compose():
            if self._narrow and isinstance(w, FooterKey) and w.action in ("save", "open"):
                continue
            yield w

    class Relayout(Message):
        pass

    def set_width(self, width: int) -> None:
        """The terminal's new width (the screen's Resize): the keys are laid out again when it crosses 100."""
        if self._narrow != (width < self.NARROW):
            self._narrow = width < self.NARROW
            # recomposed from the footer's own queue: compose binds to Footer's reactives, which only
            # resolve while the footer is the active message pump
            self.post_message(self.Relayout())

    async def on_step_footer_relayout(self, _: Relayout) -> None:
        await self.recompose()


class StepScreen(Screen):
    STEP = ""
    HELP = ""
    # Help first in every footer (a narrow one drops keys from its end). `?` is a priority key here: with a
    # field focused it would type over the field's value (a focused Input selects its text), and no
    # field of the steps takes a `?`; in a dialog (a form, the chat) it types as usual.
    BINDINGS = [Binding("f10", "app.help", "Help", key_display="F10"),
                Binding("question_mark", "app.help", "Help", show=False, priority=True)]

    @property
    def wizard(self) -> Wizard:
        return self.app  # type: ignore[return-value]  (a WizardApp: app.py is not imported here)

    @property
    def state(self) -> WizardState:
        return self.wizard.state

    def compose(self) -> ComposeResult:
        yield Stepper(id="stepper")
        yield Static(id="too-small")  # shown instead of the body below the minimum size (app.tcss)
        with Vertical(id="body"):
            yield from self.body()
        yield StepFooter(compact=True)

    def on_resize(self, ev: Resize) -> None:
        # the bar and the footer are laid out for the new width here, from the screen's own size: left to
        # their own Resize events they could keep the old layout after a quick shrink (stray words)
        self._say_size(*ev.size)
        self.query_one(Stepper).show_again(ev.size.width)
        self.query_one(StepFooter).set_width(ev.size.width)

    def _say_size(self, w: int, h: int) -> None:
        self.query_one("#too-small", Static).update(
            f"Terminal too small: {w}x{h}.\n\nqwen-tui needs at least {MIN_SIZE[0]} columns and {MIN_SIZE[1]} rows; "
            "make the window larger (ctrl+q quits). A run keeps running meanwhile.")

    def body(self) -> ComposeResult:
        raise NotImplementedError

    def on_mount(self) -> None:
        self._say_size(*self.app.size)
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
        """Ask the App to set one preset field. Always asked, even when the preset seen here holds that value
        (as when a field is filled from it): edits still queued for the App may change it first, and the App
        leaves the preset clean when a change changes nothing."""
        from ..messages import ChangePreset

        self.post_message(ChangePreset({path: value}))

    def refresh_state(self) -> None:
        """Redraw this screen from `self.state`."""

    # What this step means when SLURM gives the nodes, for a step that acts on listed nodes ("": the same).
    SLURM_NOTE = ""

    def slurm_says(self) -> bool:
        """With SLURM giving the nodes, an action on listed nodes says what happens instead; True when it did."""
        if self.SLURM_NOTE and self.state.preset.scheduler.is_slurm:
            self.notify(self.SLURM_NOTE, severity="warning", timeout=10)
            return True
        return False

    def connect_nodes(self, indices: list[int] | None = None,
                      on_progress: Callable[[int, str], None] | None = None) -> NodeResults:
        """Connect the preset's nodes through the wizard's Connections (run.api), asking the
        person about a new host key; node -> Transport | exception. Call it from a worker."""
        w = self.wizard
        return w.state.conns.connect(w.state.preset, indices, consent=w.ask_host_key, password=w.password,
                                     on_progress=on_progress)
