"""Step 6, Run: the whole cluster on one screen. A panel per node (GPU utilisation
and memory, or CPU load), the master's loss curve with lr, tokens/s, step and ETA,
the log tail of the selected node, and which node failed and what it said.
Stop-all asks first. Quitting leaves the run going; reopening re-attaches."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Log, Static
from textual.worker import Worker, WorkerState

from ...run.rundir import RunDir, RunDirError, default_runs_root
from ..messages import GpuSampleMsg, RunEnded, RunUpdate
from ..modals import Confirm, Notice
from ..widgets.gpu_panel import GpuPanel
from ..widgets.loss_chart import LossChart
from .base import StepScreen


def find_running(root: Path) -> Optional[RunDir]:
    """The newest run directory whose state says running (for re-attaching)."""
    if not root.is_dir():
        return None
    for d in sorted(root.iterdir(), reverse=True):
        rd = RunDir(d)
        try:
            if (d / "plan.json").exists() and rd.read_state().get("status") == "running":
                return rd
        except RunDirError:
            continue  # a corrupt run directory is not one to re-attach to
    return None


@dataclass
class Snapshot:
    """What the run worker hands the screen: copies, never live objects."""

    nodes: dict[int, tuple[str, Optional[str]]] = field(default_factory=dict)  # rank -> (status, error)
    progress: Any = None
    log: list[str] = field(default_factory=list)
    log_rank: int = 0


class RunScreen(StepScreen):
    STEP = "run"
    BINDINGS = [
        Binding("s", "stop", "Stop all"),
        Binding("n", "next_node", "Next node's log"),
        Binding("l", "launch", "Launch"),
        Binding("c", "chat", "Chat"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.launcher = None
        self.monitor = None
        self.log_rank = 0
        self.outcome = None
        self.last_snapshot: Optional[Snapshot] = None

    def body(self) -> ComposeResult:
        yield Static(id="run-status")
        yield Horizontal(id="gpu-panels")
        with Horizontal(id="run-lower"):
            with Vertical(id="loss-box"):
                yield Label("Loss (master)", classes="section")
                yield LossChart(id="loss")
            with Vertical(id="log-box"):
                yield Label("Log", id="log-title", classes="section")
                yield Log(id="log", max_lines=400)

    def refresh_state(self) -> None:
        st = self.state
        # once a launch was tried, the status line keeps what it said (a failure's cause)
        if self.launcher is None and self.outcome is None and st.run_status is None:
            self.query_one("#run-status", Static).update(
                Text("Nothing running. Review (F5) shows what will run; l launches it from here.", style="dim"))
            self.query_one(LossChart).show(None)

    # ---------------------------------------------------------------- launch / attach
    def action_launch(self) -> None:
        if self.launcher is not None and self.state.run_status == "running":
            self.notify("already running", severity="warning")
            return
        self.launch(force=False)

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        pending, self._pending = getattr(self, "_pending", None), None
        if pending is not None:
            pending()

    def _when_mounted(self, fn) -> bool:
        """The screen is composed the first time it is shown; a launch or attach asked
        for before that runs once it is."""
        if self.query("#run-status"):
            return False
        self._pending = fn
        return True

    def launch(self, *, force: bool) -> None:
        if self._when_mounted(lambda: self.launch(force=force)):
            return
        self.outcome = None
        self.state.run_status = "starting"
        self._status(Text("starting: connecting, checking, launching every node…", style="yellow"))
        self._launch_worker(force)

    @work(thread=True, exclusive=True, exit_on_error=False, group="run")
    def _launch_worker(self, force: bool) -> None:
        from ...plan import make_plan
        from ...run.launcher import LaunchError
        from ...run.rundir import new_run_id
        from ...run.session import start_run
        from .. import core

        app = self.wizard
        preset = app.state.preset
        conns = app.connect()
        bad = {i: e for i, e in conns.items() if isinstance(e, BaseException)}
        if bad:
            self.app.call_from_thread(self._failed_start, "not launched: every node must be reachable\n" +
                                      "\n".join(f"node {i}: {e}" for i, e in bad.items()))
            return
        facts, items = core.run_checks(preset, conns)
        facts = core.merge_facts(app.state.facts, facts)
        errors = [a for a in items if a.level == "error"]
        if errors and not force:
            self.app.call_from_thread(self._failed_start, "not launched:\n" +
                                      "\n".join(f"{a.code}: {a.message}" for a in errors))
            return
        root = app.runs_root or default_runs_root()
        run_id = new_run_id(preset.name or (app.state.path.stem if app.state.path else None))
        plan = make_plan(preset, run_id=run_id, local_run_dir=str(root / run_id), base_dir=app.base_dir,
                         facts=facts, local_python=app.local_python)
        try:
            la = start_run(preset, plan, conns, facts, root)
        except LaunchError as e:
            self.app.call_from_thread(self._failed_start, str(e))
            return
        self.app.call_from_thread(self._started, la)
        self._follow(la)

    def attach(self, rd: RunDir) -> None:
        if self._when_mounted(lambda: self.attach(rd)):
            return
        self._attach_worker(rd)

    @work(thread=True, exclusive=True, exit_on_error=False, group="run")
    def _attach_worker(self, rd: RunDir) -> None:
        from ...preset import load_preset
        from ...run.launcher import Launcher

        app = self.wizard
        preset = load_preset(rd.path / "preset.yaml")
        if preset.cluster.nodes != app.state.preset.cluster.nodes:
            self.app.call_from_thread(app.set_preset, preset, dirty=False)
        conns = app.connect()
        bad = {i: e for i, e in conns.items() if isinstance(e, BaseException)}
        if bad:
            self.app.call_from_thread(self._failed_start, "cannot re-attach:\n" +
                                      "\n".join(f"node {i}: {e}" for i, e in bad.items()))
            return
        try:
            la = Launcher.attach(rd, conns)
            refused = la.refusals()  # never follow (or later stop) pids that are not this run's job
        except RunDirError as e:
            self.app.call_from_thread(self._failed_start, f"cannot re-attach: {e}")
            return
        if refused:
            self.app.call_from_thread(self._failed_start, "cannot re-attach:\n" + "\n".join(
                f"node {r}: refusing to signal pid {la.nodes[r].pid}: {why}" for r, why in sorted(refused.items())))
            return
        self.app.call_from_thread(self._started, la)
        self._follow(la)

    def _follow(self, la) -> None:
        """The run loop (this worker's thread): poll the launcher, post snapshots.
        Leaving the app detaches (the run goes on); only stop-all ends it."""
        from textual.worker import get_current_worker

        worker = get_current_worker()

        def update(launcher) -> None:
            if worker.is_cancelled or not self.app.is_running:
                raise _Detached()
            rank = self.log_rank
            try:
                log = launcher.log_tail(rank, lines=60)
            except Exception as e:  # a node gone for a moment: say so in the log pane
                log = [f"(cannot read node {rank}'s log: {e})"]
            snap = Snapshot(nodes={r: (s.status, s.error) for r, s in launcher.nodes.items()},
                            progress=_copy_progress(launcher.metrics.progress), log=log, log_rank=rank)
            self.post_message(RunUpdate(snap))

        try:
            out = la.wait(interval=1.0, on_update=update)
            update(la)
        except _Detached:
            return
        self.post_message(RunEnded(out))

    def on_worker_state_changed(self, ev: Worker.StateChanged) -> None:
        """A launch, attach or follow worker that died: StepScreen's handler (textual
        calls it too, after this one) shows the error; this screen says what it means
        for the run, so it never stays at "starting"."""
        if ev.state != WorkerState.ERROR or ev.worker.group != "run":
            return
        err = f"{type(ev.worker.error).__name__}: {ev.worker.error}"
        if self.state.run_status != "running":  # died before a job was started or attached
            self.state.run_status = "failed"
            self._status(Text(f"not launched: {err}", style="bold red"))
        else:  # a job is on: it runs on, unfollowed, until stop-all or a re-attach
            self._status(Text(f"lost track of the run ({err}); the job may still be running: s stops it, "
                              "reopening qwen-tui re-attaches", style="bold red"))
        self.wizard.facts_changed()

    def _failed_start(self, why: str) -> None:
        self.state.run_status = "failed"
        self._status(Text(why, style="bold red"))
        self.app.push_screen(Notice("Not launched", why))
        self.wizard.facts_changed()

    async def _started(self, la) -> None:
        from ...run.gpuseries import NodeWatch

        self.launcher = la
        self.state.run_status = "running"
        self.state.run_dir = la.run_dir.path
        await self.show_panels([(c.rank, c.label) for c in la.plan.nodes])
        self._status(Text(f"running · {la.plan.nnodes} nodes · world size {la.plan.world_size} · "
                          f"run dir {la.run_dir.path}", style="green"))
        if self.monitor is not None:
            self.monitor.stop()
        gpu_nodes = {}
        for r in la.transports:
            nf = self.state.facts.nodes.get(r)
            if nf is not None and nf.gpus is not None:
                gpu_nodes[r] = bool(nf.gpus)
        # The panels' samples; with --report_to they also go to the worker's trackers (run.gpuseries).
        self.monitor = NodeWatch(la, lambda s: self.post_message(GpuSampleMsg(s)), gpu_nodes=gpu_nodes)
        self.monitor.start()
        self.wizard.facts_changed()

    async def show_panels(self, nodes: list[tuple[int, str]]) -> None:
        box = self.query_one("#gpu-panels", Horizontal)
        # the old panels must be gone before new ones with the same ids mount
        await box.remove_children()
        await box.mount_all([GpuPanel(r, label, classes="gpu-panel", id=f"gpu-{r}") for r, label in nodes])

    # ---------------------------------------------------------------- updates
    def _status(self, t: Text) -> None:
        self.query_one("#run-status", Static).update(t)

    def on_gpu_sample_msg(self, msg: GpuSampleMsg) -> None:
        for p in self.query(GpuPanel):
            if p.rank == msg.sample.rank:
                p.set_sample(msg.sample)

    def on_run_update(self, msg: RunUpdate) -> None:
        snap: Snapshot = msg.snapshot
        self.last_snapshot = snap
        for p in self.query(GpuPanel):
            if p.rank in snap.nodes:
                p.set_status(*snap.nodes[p.rank])
        self.query_one(LossChart).show(snap.progress, width=max(20, self.query_one(LossChart).size.width - 12))
        log = self.query_one(Log)
        log.clear()
        log.write_lines(snap.log)
        panel = next((p for p in self.query(GpuPanel) if p.rank == snap.log_rank), None)
        label = panel.label if panel else snap.log_rank
        self.query_one("#log-title", Label).update(f"Log: node {snap.log_rank} ({label})  ·  n: next node")

    def on_run_ended(self, msg: RunEnded) -> None:
        out = msg.outcome
        self.outcome = out
        self.state.run_status = out.status
        if self.monitor is not None:
            self.monitor.stop(flush_last=False)  # the worker has ended: nobody reads a last window
            self.monitor = None
        style = {"ok": "bold green", "stopped": "yellow"}.get(out.status, "bold red")
        status = Text(f"{out.status}: {out.message}", style=style)
        ev = self.launcher.metrics.progress.last_eval if self.launcher is not None else None  # the follower is done
        if ev is not None:
            status.append(f" · last eval loss {ev['eval_loss']:.4f} at step {ev.get('step')}", style="bold")
        self._status(status)
        if out.status == "failed" and out.failed_rank is not None:
            self.log_rank = out.failed_rank  # show what the failed node said
            self.notify(out.message, severity="error", title="Run failed", timeout=15)
        self.wizard.facts_changed()

    # ---------------------------------------------------------------- keys
    def action_next_node(self) -> None:
        if self.launcher is not None:
            self.log_rank = (self.log_rank + 1) % len(self.launcher.plan.nodes)
            self.query_one("#log-title", Label).update(f"Log: node {self.log_rank} (next update)")

    def action_chat(self) -> None:
        """A finished run's model, on its master (the launcher's transport to node 0)."""
        from ...run.after import AfterRunError, locate
        from ..chat import ChatScreen

        if self.launcher is None or self.state.run_status != "ok":
            self.notify("chat needs a run that finished training", severity="warning")
            return
        try:
            result = locate(self.launcher.run_dir.path)
        except AfterRunError as e:
            self.notify(str(e), severity="error", title="Chat")
            return
        self.app.push_screen(ChatScreen(result, self.launcher.transports[0]))

    def action_stop(self) -> None:
        if self.launcher is None or self.state.run_status != "running":
            self.notify("nothing running")
            return

        def answer(yes: Optional[bool]) -> None:
            if yes:
                self._status(Text("stopping every node…", style="yellow"))
                self.launcher.request_stop()

        self.app.push_screen(Confirm("Stop the run on every node?",
                                     "Every node's processes get SIGTERM, then SIGKILL after a grace period. "
                                     "Checkpoints already written stay.", yes="Stop all", danger=True), answer)


class _Detached(Exception):
    """The app is closing: stop watching, leave the run alone."""


def _copy_progress(p):
    from ...run.metrics import TrainingProgress

    return TrainingProgress(start=p.start, end=p.end, steps=list(p.steps), events=list(p.events))
