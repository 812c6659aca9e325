"""Before a launch, the questions whose answer could lose work: errors the checks found,
and an output directory on node 0 that already holds a run (the new run's checkpoints and
model would land next to and over the old ones). The look at node 0 runs in a thread
worker (a remote master answers over SSH, bounded); the questions are asked in order and
the launch goes ahead only after a yes to each. Review's `l` and the Run step's `l` both
come through here."""

from __future__ import annotations

from functools import partial

from textual.worker import Worker, WorkerState

from ..base.levels import Level
from ..run import api
from ..run.states import RunState
from .modals import Confirm
from .wizard import Wizard

LOOK = "launch-look"  # the look's worker: the App hands its state changes to LaunchGuard.worker_changed


def questions(advice: list, out: str | None, entries: list[str] | None, ask_errors: bool) -> list[Confirm]:
    asks: list[Confirm] = []
    errs = [a for a in advice if a.level == Level.ERROR]
    if errs and ask_errors:
        asks.append(Confirm("Launch despite errors?", "\n".join(f"{a.code}: {a.message}" for a in errs),
                            yes="Launch", danger=True))
    if entries:
        shown = ", ".join(sorted(entries)[:8]) + (f" and {len(entries) - 8} more" if len(entries) > 8 else "")
        asks.append(Confirm("The output directory already holds a run",
                            f"{out} on node 0 has: {shown}\n\nThe new run writes its checkpoints and model there, "
                            "next to and over these. To keep them, set another output dir (F4), or resume from "
                            "one of them. Launch into it anyway?", yes="Launch", no="Go back", danger=True))
    return asks


class LaunchGuard:
    """The App's helper (`app.launch_guard`): `launch_asking()` looks, asks, then starts the Run
    step's launch. The App passes on its worker state changes (worker_changed)."""

    def __init__(self, app: Wizard) -> None:
        self.app = app
        self.ask_errors = True  # this launch asks about the checks' errors (Review's l; the Run step's does not)

    def launch_asking(self, *, ask_errors: bool = True) -> None:
        app = self.app
        st = app.state
        if st.run_status in (RunState.RUNNING, RunState.STARTING, RunState.PENDING):
            app.notify("a run is already going: see the Run step (F6)", severity="warning")
            return
        preset = st.preset.model_copy(deep=True)
        self.ask_errors = ask_errors
        app.run_worker(partial(api.look_at_output_dir, preset, api.master_transport(preset, st.conns),
                               base_dir=app.base_dir, local_python=app.local_python, facts=st.facts),
                       thread=True, exit_on_error=False, group=LOOK, name=LOOK, exclusive=True)

    def worker_changed(self, ev: Worker.StateChanged) -> None:
        app = self.app
        if ev.worker.name != LOOK:
            return
        if ev.state == WorkerState.ERROR:
            app.worker_failed(ev.worker)
        elif ev.state == WorkerState.SUCCESS:
            out, entries, why = ev.worker.result
            if out is not None and entries is None and why:
                app.notify(f"could not look at {out} on node 0 ({why}): launching without that check",
                           severity="warning", title="Launch")
            errs = any(a.level == Level.ERROR for a in app.state.advice)
            self._ask_then_launch(questions(app.state.advice, out, entries, self.ask_errors),
                                  force=errs and self.ask_errors)

    def _ask_then_launch(self, asks: list[Confirm], force: bool) -> None:
        app = self.app
        if not asks:
            app.switch_screen("run")
            app.get_screen("run").launch(force=force)
            return
        app.push_screen(asks[0], lambda yes: self._ask_then_launch(asks[1:], force) if yes else None)
