"""What the step screens use of the App, as a Protocol: the screens type-check against
it without importing app.py (which opens the screens), so there is no import circle."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from textual.worker import Worker

from ..preset.schema import Preset
from ..wizard.state import WizardState


class Wizard(Protocol):
    """WizardApp's side the screens call: its state (the connections are in it:
    state.conns), host-key consent and notifications, and the few App methods they
    reach through it."""

    state: WizardState
    runs_root: Path | None
    base_dir: str
    local_python: str
    password: str | None

    def set_preset(self, preset: Preset, *, note: str | None = None, dirty: bool = True) -> None: ...

    def facts_changed(self) -> None: ...

    def apply_fix(self, item: Any) -> bool: ...

    def launch_asking(self, *, ask_errors: bool = True) -> None: ...

    def ask_host_key(self, label: str, host: str, key: Any) -> bool: ...

    def worker_failed(self, worker: Worker) -> None: ...

    # textual.App's, used through `self.wizard`
    is_running: bool

    def push_screen(self, *args: Any, **kwargs: Any) -> Any: ...

    def switch_screen(self, *args: Any, **kwargs: Any) -> Any: ...

    def get_screen(self, *args: Any, **kwargs: Any) -> Any: ...

    def call_from_thread(self, *args: Any, **kwargs: Any) -> Any: ...

    def run_worker(self, *args: Any, **kwargs: Any) -> Any: ...

    def notify(self, *args: Any, **kwargs: Any) -> None: ...
