"""Before a launch, the questions whose answer could lose work: errors the checks found,
and an output directory on node 0 that already holds a run (the new run's checkpoints and
model would land next to and over the old ones). The look at node 0 runs in a thread
worker (a remote master answers over SSH, bounded); the questions are asked in order and
the launch goes ahead only after a yes to each. Review's `l` and the Run step's `l` both
come through here."""

from __future__ import annotations

import posixpath
from functools import partial
from typing import Any, Optional

from textual.worker import Worker, WorkerState

from ..base.levels import Level
from ..plan.launch import make_plan
from ..run.states import RunState
from .modals import Confirm

LOOK_TIMEOUT_S = 10.0


def look_at_output_dir(preset, base_dir: str, local_python: str, facts, transport) -> tuple[Optional[str], Any, str]:
    """(output dir on node 0, its entries or None when it could not be looked at, why not). Blocking."""
    from ..nodes.transport import TransportError

    t = preset.training
    if t.resume_from_checkpoint:  # continuing a run there is the point
        return None, None, ""
    node0 = make_plan(preset, run_id="look", local_run_dir="runs/look", base_dir=base_dir, facts=facts,
                      local_python=local_python).nodes[0]
    out = t.output_dir if posixpath.isabs(t.output_dir) else posixpath.join(node0.workdir, t.output_dir)
    if transport is None:
        return out, None, "node 0 is not connected yet"
    try:
        res = transport.run(["ls", "-A", "--", out], timeout=LOOK_TIMEOUT_S)
    except TransportError as e:
        return out, None, str(e)
    return out, (res.stdout.split() if res.ok else []), ""  # a missing directory holds nothing


def questions(advice: list, out: Optional[str], entries: Optional[list[str]], ask_errors: bool) -> list[Confirm]:
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
    """WizardApp's part: `launch_asking()` looks, asks, then starts the Run step's launch."""

    _ask_errors = True

    def launch_asking(self, *, ask_errors: bool = True) -> None:
        from ..nodes.transport import LocalTransport

        app: Any = self
        st = app.state
        if st.run_status in (RunState.RUNNING, RunState.STARTING):
            app.notify("a run is already going: see the Run step (F6)", severity="warning")
            return
        preset = st.preset.model_copy(deep=True)
        master = preset.cluster.nodes[0]
        transport = LocalTransport(master.label) if master.is_local else st.conns.get(0)
        self._ask_errors = ask_errors
        app.run_worker(partial(look_at_output_dir, preset, app.base_dir, app.local_python, st.facts, transport),
                       thread=True, exit_on_error=False, group="launch-look", name="launch-look", exclusive=True)

    def on_worker_state_changed(self, ev: Worker.StateChanged) -> None:
        app: Any = self
        if ev.worker.name != "launch-look":
            return
        if ev.state == WorkerState.ERROR:
            app.worker_failed(ev.worker)
        elif ev.state == WorkerState.SUCCESS:
            out, entries, why = ev.worker.result
            if out is not None and entries is None and why:
                app.notify(f"could not look at {out} on node 0 ({why}): launching without that check",
                           severity="warning", title="Launch")
            errs = any(a.level == Level.ERROR for a in app.state.advice)
            self._ask_then_launch(questions(app.state.advice, out, entries, self._ask_errors),
                                  force=errs and self._ask_errors)

    def _ask_then_launch(self, asks: list[Confirm], force: bool) -> None:
        app: Any = self
        if not asks:
            app.switch_screen("run")
            app.get_screen("run").launch(force=force)
            return
        app.push_screen(asks[0], lambda yes: self._ask_then_launch(asks[1:], force) if yes else None)
