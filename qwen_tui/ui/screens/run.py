"""Step 6, Run: the whole cluster on one screen. A panel per node (GPU utilisation
and memory, or CPU load), the master's loss curve with lr, tokens/s, step and ETA,
the log tail of the selected node (wrapped, following the tail), and which node failed and
what it said. Stop-all asks first, then shows where each node's stop is. A launch from here
is relaunched after a failure as training.restarts allows, and the status line names the
attempt. Quitting leaves the run going; reopening re-attaches, and relaunches after a failure when the
face that launched the run is gone."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Static
from textual.worker import Worker, WorkerState, get_current_worker

from ...run import api
from ...run.rundir import RunDir, default_runs_root, new_run_id
from ...run.states import JobState, RunState
from ..messages import (
    GpuSampleMsg,
    JobLines,
    JobQueued,
    LaunchEvent,
    RunEnded,
    RunNote,
    RunStarted,
    RunStopping,
    RunUpdate,
)
from ..modals import Confirm, Notice
from ..styles import ERROR, GOOD, SEVERITY, WARNING, WARNING_STRONG, level_style, outcome_style, tone
from ..widgets.gpu_panel import GpuPanel
from ..widgets.log_pane import LogPane
from ..widgets.loss_chart import LossChart
from .base import StepScreen

NOTICES_SHOWN = 4  # the monitor's latest notices above the log pane


class _Detached(Exception):
    """The follower stops because the app is closing; the run goes on."""


class RunScreen(StepScreen):
    STEP = "run"
    BINDINGS = [
        Binding("s", "stop", "Stop"),
        Binding("n", "next_node", "Next log"),
        Binding("k", "stacks", "Stacks"),
        Binding("l", "launch", "Launch"),
        Binding("c", "chat", "Chat"),
        Binding("m", "merge", "Merge"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.launcher = None
        self.monitor = None
        self.log_rank = 0
        self.outcome = None
        self.last_snapshot: api.Snapshot | None = None
        self._stop_wanted = False  # stop-all asked for this run (read by the follower's thread)
        self._checking: tuple[str, dict[int, list[str]]] | None = None  # the launch checks so far (_check_line)
        self._notices_shown = 0  # the follow's notices already popped up
        self._pending: Callable[[], None] | None = None  # a launch or attach asked for before the first compose
        self._job = None  # a SLURM batch job submitted from here (run.slurm.job.Submitted)
        self._job_lines: list[str] = []  # what it printed

    def body(self) -> ComposeResult:
        yield Static(id="run-status")
        yield Horizontal(id="gpu-panels")
        with Horizontal(id="run-lower"):
            with Vertical(id="loss-box"):
                yield Label("Loss (master)", classes="section")
                yield LossChart(id="loss")
            with Vertical(id="log-box"):
                yield Label("Log", id="log-title", classes="section")
                yield Static(id="run-notices")  # what the monitor noticed: unreachable, hang and stacks, straggler
                yield LogPane(id="log")

    def refresh_state(self) -> None:
        st = self.state
        # once a launch was tried, the status line keeps what it said (a failure's cause)
        if self.launcher is None and self.outcome is None and st.run_status is None:
            self.query_one("#run-status", Static).update(
                Text("Nothing running. Review (F5) shows what will run; l launches it from here.", style="dim"))
            self.query_one(LossChart).show(None)

    # ---------------------------------------------------------------- launch / attach
    def action_launch(self) -> None:
        running = self.launcher is not None and self.state.run_status == RunState.RUNNING
        if self.state.run_status in (RunState.STARTING, RunState.PENDING) or running:
            # a second launch would cancel the first one's worker and leave its job unfollowed
            self.notify(f"already {self.state.run_status}", severity="warning")
            return
        self.wizard.launch_asking(ask_errors=False)  # asks about an output dir that holds a run

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        pending, self._pending = self._pending, None
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
        self._stop_wanted = False
        self._checking = None
        self._forget_last_run()
        self.state.run_status = RunState.STARTING
        self.wizard.facts_changed()  # the bar marks the Run step as under way (▶) from the start
        self._status(Text("starting: connecting, checking, launching every node…", style=tone(WARNING)))
        self._launch_worker(force)

    @work(thread=True, exclusive=True, exit_on_error=False, group="run")
    def _launch_worker(self, force: bool) -> None:
        """The launch API's sequence on this worker's thread; every event goes to the screen as a
        Message. A bug raises: on_worker_state_changed shows it, the status never stays at starting. A SLURM
        preset is submitted from here and its job followed (run/slurm/job.py), or inside an allocation runs on
        the allocation's nodes."""
        app = self.wizard
        st = app.state
        root = app.runs_root or default_runs_root()
        preset = st.preset
        name = st.preset.name or (st.path.stem if st.path else None)
        if preset.scheduler.is_slurm and not preset.cluster.nodes:
            from ...run.slurm.allocation import NotInAllocation, allocation_id, on_allocation
            from ...run.slurm.job import submit

            job = allocation_id()
            if job is None:
                self._follow_submitted(submit(preset, name or "run", root=root,
                                              replay_flags=["--force"] if force else []))
                return
            try:
                preset = on_allocation(preset, job)
            except (NotInAllocation, RuntimeError) as e:
                self.post_message(LaunchEvent(api.Failure("connect", f"not launched: {e}")))
                return
        req = api.LaunchRequest(preset, root, new_run_id(name), base_dir=app.base_dir,
                                local_python=app.local_python, force=force, facts=st.facts,
                                consent=app.ask_host_key, password=app.password)
        self._run_events(api.launch(req, st.conns), relaunch=req)

    def _follow_submitted(self, events) -> None:
        """A SLURM batch job submitted from here: its states, its output, then each attempt's steps as any run,
        and SLURM's final word as the outcome. Stop-all cancels the job (scancel)."""
        from ...run.launcher import RunOutcome
        from ...run.slurm.job import JobEnded, JobOutput, Queued, Submitted, follow_job

        worker = get_current_worker()
        done = lambda: worker.is_cancelled or not self.app.is_running  # noqa: E731
        for ev in events:
            if isinstance(ev, Submitted):
                self._job = ev
                events = follow_job(RunDir(ev.run_dir), ev.job_id, cancelled=done,
                                    stop_wanted=lambda: self._stop_wanted)
                break
            self.post_message(LaunchEvent(ev))
        else:
            return  # not submitted: the Failure says why
        for ev in events:
            if isinstance(ev, Queued):
                self.post_message(JobQueued(ev))
            elif isinstance(ev, JobOutput):
                self.post_message(JobLines(ev.lines))
            elif isinstance(ev, api.Started):
                self.post_message(RunStarted(ev.launcher))
                for got in api.follow(ev.launcher, interval=1.0, log_rank=lambda: self.log_rank, cancelled=done):
                    if isinstance(got, api.Snapshot):
                        self.post_message(RunUpdate(got))
                    elif isinstance(got, api.Stopping):
                        self.post_message(RunStopping(got))
            elif isinstance(ev, JobEnded):
                self.post_message(RunEnded(RunOutcome(ev.status, ev.message, None, {}, cause=f"SLURM_{ev.slurm_state}")))
                return
            else:
                self.post_message(LaunchEvent(ev))

    def attach(self, rd: RunDir) -> None:
        if self._when_mounted(lambda: self.attach(rd)):
            return
        self._attach_worker(rd)

    @work(thread=True, exclusive=True, exit_on_error=False, group="run")
    def _attach_worker(self, rd: RunDir) -> None:
        app = self.wizard

        def show(preset) -> None:  # before connecting: the connections must be to the run's nodes
            if preset.cluster.nodes != app.state.preset.cluster.nodes:
                self.app.call_from_thread(app.set_preset, preset, dirty=False)

        self._run_events(api.attach(rd.path, app.state.conns, consent=app.ask_host_key, password=app.password,
                                    on_preset=show))

    def _run_events(self, events, relaunch: api.LaunchRequest | None = None) -> None:
        """Post each launch/attach event; once the job runs, follow it (this worker's thread) and post
        snapshots. Leaving the app detaches (the run goes on); only stop-all ends it. `relaunch`: the
        request of a launch from here, whose failed attempts are relaunched as training.restarts allows
        (run/recovery/restarts.py, as replay does); an attached run is relaunched by its driver, or from here when the
        face that launched it is gone (run/recovery/driver.py)."""
        for ev in events:
            if isinstance(ev, api.Started):
                self.post_message(RunStarted(ev.launcher))
                try:
                    out = self._follow_attempts(ev.launcher, relaunch)
                except _Detached:
                    return
                self.post_message(RunEnded(out))
                return
            self.post_message(LaunchEvent(ev))

    def _follow_attempts(self, first, req: api.LaunchRequest | None):
        """Follow the run to its outcome, through every relaunch when `req` allows restarts."""
        from ...run.recovery.restarts import Restarts, run_facts

        worker = get_current_worker()

        def follow_one(la, left: float | None):
            if la is not first:  # a relaunch: the screen follows the new attempt's nodes and launcher
                self.post_message(RunStarted(la))
                if self._stop_wanted:  # stop-all was asked while the last attempt was being relaunched
                    la.request_stop()
            for got in api.follow(la, interval=1.0, max_seconds=left, log_rank=lambda: self.log_rank,
                                  cancelled=lambda: worker.is_cancelled or not self.app.is_running):
                if isinstance(got, api.Snapshot):
                    self.post_message(RunUpdate(got))
                elif isinstance(got, api.Stopping):
                    self.post_message(RunStopping(got))
                else:
                    return got.outcome
            raise _Detached  # the app is closing: the job runs on, to be re-attached

        if req is None:  # an attached run: its driver relaunches it, or this face when that one is gone
            out = follow_one(first, None)
            return self._after_failure(first, out, follow_one) if out.status == RunState.FAILED else out
        if not req.preset.training.restarts:
            return follow_one(first, None)
        rs = Restarts(req.preset, first.transports, run_facts(first.run_dir),
                      exclude_failed=req.preset.training.exclude_failed, base_dir=req.base_dir,
                      local_python=req.local_python, say=lambda text: self.post_message(RunNote(text)))
        return rs.follow(first, follow_one)

    def _after_failure(self, la, out, follow_one):
        """An attached attempt failed: follow the next attempt its driver starts, or, with no live driver
        (the face that launched it is gone), relaunch it from here as training.restarts allows."""
        from ...run.recovery import driver
        from ...run.recovery.restarts import Restarts, next_or_take_over

        worker = get_current_worker()
        what, _ = next_or_take_over(la.run_dir, la.attempt,
                                    cancelled=lambda: worker.is_cancelled or not self.app.is_running)
        if what == "cancelled":
            raise _Detached
        if what == "drive":
            try:
                rs = Restarts.from_run_dir(la, say=lambda text: self.post_message(RunNote(text)))
            except (OSError, ValueError):
                driver.release(la.run_dir)
                raise  # on_worker_state_changed says so; the failed attempt stays the run's last word
            return rs.take_over(la, out, follow_one)
        if what == "next":  # its driver relaunched it: attach to the new attempt (its own nodes)
            app = self.wizard
            for ev in api.attach(la.run_dir.path, app.state.conns, consent=app.ask_host_key, password=app.password):
                if isinstance(ev, api.Started):
                    self.post_message(RunStarted(ev.launcher))
                    return self._follow_attempts(ev.launcher, None)
                if isinstance(ev, api.AlreadyEnded):  # the next attempt ended before this face found it
                    from ...run.launcher import RunOutcome

                    return RunOutcome(ev.status, ev.message, None, {})
                self.post_message(LaunchEvent(ev))
        return out

    def on_worker_state_changed(self, ev: Worker.StateChanged) -> None:
        """A launch, attach or follow worker that died: StepScreen's handler (textual
        calls it too, after this one) shows the error; this screen says what it means
        for the run, so it never stays at "starting"."""
        if ev.state != WorkerState.ERROR or ev.worker.group != "run":
            return
        err = f"{type(ev.worker.error).__name__}: {ev.worker.error}"
        if self.state.run_status != RunState.RUNNING:  # died before a job was started or attached
            self.state.run_status = RunState.FAILED
            self._status(Text(f"not launched: {err}", style=tone(ERROR)))
        else:  # a job is on: it runs on, unfollowed, until stop-all or a re-attach
            self._status(Text(f"lost track of the run ({err}); the job may still be running: s stops it, "
                              "reopening qwen-tui re-attaches", style=tone(ERROR)))
        self.wizard.facts_changed()

    def on_launch_event(self, msg: LaunchEvent) -> None:
        ev = msg.event
        if isinstance(ev, api.Stage):
            self._status(Text(ev.text, style=tone(WARNING)))
        elif isinstance(ev, api.CheckProgress):  # the checks before a launch take seconds a node: say where they are
            self._status(Text(self._check_line(ev), style=tone(WARNING)))
        elif isinstance(ev, api.Failure):
            self._failed_start(ev)
        elif isinstance(ev, api.AlreadyEnded):
            self.state.run_status = ev.status
            self._status(Text(f"run {ev.run_id} already ended ({ev.status}): {ev.message}", style="dim"))
            self.wizard.facts_changed()

    def on_job_queued(self, msg: JobQueued) -> None:
        q = msg.queued
        self.state.run_status = RunState.PENDING if q.state == "PENDING" else RunState.STARTING
        style = tone(WARNING) if q.state == "PENDING" else tone(GOOD)
        text = Text(f"SLURM: {q.text}", style=style)
        if self._job is not None:
            text.append(f" · run dir {self._job.run_dir}", style="dim")
        if q.state == "RUNNING" and self.launcher is None:
            text.append("\nthe job's own qwen-tui checks its nodes through srun, then starts a step per node",
                        style="dim")
        self._status(text)
        self.wizard.facts_changed()

    def on_job_lines(self, msg: JobLines) -> None:
        self._job_lines = (self._job_lines + list(msg.lines))[-400:]
        if self.launcher is None:  # until the steps run, the log pane shows the job's own output
            self.query_one(LogPane).show(-1, self._job_lines)
            self.query_one("#log-title", Label).update("Log: the batch job's output")

    def _check_line(self, ev) -> str:
        """The check under way, and under it what each node has answered to the checks so far."""
        if self._checking is None:
            self._checking = ("", {})
        head, answers = self._checking
        if ev.node is None:
            head = f"checking · {ev.check}: {ev.text}"
        else:
            answers.setdefault(ev.node, []).append(ev.text)
        self._checking = (head or f"checking · {ev.check}", answers)
        nodes = self.state.preset.cluster.nodes
        per_node = [f"node {i} ({nodes[i].label if i < len(nodes) else '?'}): {', '.join(answers[i])}"
                    for i in sorted(answers)]
        return "\n".join([self._checking[0], *per_node])

    def _failed_start(self, f: api.Failure) -> None:
        self.state.run_status = RunState.FAILED
        self._status(Text(f.message, style=tone(ERROR)))
        title = "Cannot re-attach" if f.cause.startswith("cannot attach") else "Not launched"
        self.app.push_screen(Notice(title, f.message))
        self.wizard.facts_changed()

    def _forget_last_run(self) -> None:
        """A new run (launched here, or re-attached): the last one's log, curve and snapshot go."""
        self.query_one(LogPane).clear()
        self.query_one(LossChart).show(None)
        self.last_snapshot = None

    async def on_run_started(self, msg: RunStarted) -> None:
        from ...run.watch.gpuseries import NodeWatch

        la = msg.launcher
        if self.launcher is not None and self.launcher.run_dir.path != la.run_dir.path:
            self._forget_last_run()  # a relaunch of the same run keeps its log; another run does not
        self.launcher = la
        self.state.run_status = RunState.RUNNING
        self.state.run_dir = la.run_dir.path
        self.wizard.facts_changed()  # before the panels mount: the first snapshot may be queued behind them
        await self.show_panels([(c.rank, c.label) for c in la.plan.nodes])
        status = Text("running · ", style=tone(GOOD))
        if la.attempt_note:  # a relaunch after a failure: which attempt, why, and where it resumed
            status.append(la.attempt_note, style=tone(WARNING_STRONG))
            status.append(" · ")
        status.append(f"{la.plan.nnodes} nodes · world size {la.plan.world_size} · run dir {la.run_dir.path}")
        self._status(status)
        if self.monitor is not None:
            self.monitor.stop()
        gpu_nodes = {}
        for r in la.transports:
            nf = self.state.facts.nodes.get(r)
            if nf is not None and nf.gpus is not None:
                gpu_nodes[r] = bool(nf.gpus)
        # The panels' samples; with --report_to they also go to the worker's trackers (run.watch.gpuseries).
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
        snap: api.Snapshot = msg.snapshot
        self.last_snapshot = snap
        for p in self.query(GpuPanel):
            if p.rank in snap.nodes:
                p.set_status(*snap.nodes[p.rank], note=snap.notes.get(p.rank))
                p.set_class(snap.hung == p.rank, "-hung")  # the node a hang is blamed on, marked until it ends
        self._show_notices(snap.notices)
        self.query_one(LossChart).show(snap.progress, width=max(20, self.query_one(LossChart).size.width - 12),
                                       hung=snap.hung is not None)
        self.query_one(LogPane).show(snap.log_rank, snap.log)
        panel = next((p for p in self.query(GpuPanel) if p.rank == snap.log_rank), None)
        label = panel.label if panel else snap.log_rank
        self.query_one("#log-title", Label).update(f"Log: node {snap.log_rank} ({label})")  # n: the footer says

    def _show_notices(self, notices: tuple) -> None:
        """The monitor's notices above the log: the last few, newest first, a line each (the whole text pops up
        as it comes, and k shows a hang's stacks), so the newest, the end of a hang say, is never below the box's
        fold."""
        if len(notices) < self._notices_shown:  # a relaunch's follow starts its own list
            self._notices_shown = 0
        for n in notices[self._notices_shown:]:
            self.notify(n.text, title=n.kind.replace("_", " ").title(), timeout=15,
                        severity=SEVERITY[n.level])
        self._notices_shown = len(notices)
        box = self.query_one("#run-notices", Static)
        lines = []
        for n in reversed(notices[-NOTICES_SHOWN:]):
            line = Text(n.text, style=level_style(n.level), no_wrap=True, overflow="ellipsis")
            if box.size.width:
                line.truncate(box.size.width, overflow="ellipsis")
            lines.append(line)
        box.update(Text("\n").join(lines))

    def on_run_note(self, msg: RunNote) -> None:
        if not msg.text.startswith("note: "):  # a relaunch under way; a note about the settings only pops up
            self._status(Text(msg.text, style=tone(WARNING_STRONG)))
        self.notify(msg.text, title="Run", severity="warning", timeout=10)

    def on_run_stopping(self, msg: RunStopping) -> None:
        """A stop takes seconds (each node's workers are asked, waited for, then killed): say where each node is."""
        ev: api.Stopping = msg.stopping
        self._status(Text(ev.text, style=tone(WARNING)))
        for p in self.query(GpuPanel):
            if p.rank in ev.nodes:
                p.set_status(JobState.STOPPING, None, note=ev.nodes[p.rank])

    def on_run_ended(self, msg: RunEnded) -> None:
        out = msg.outcome
        self.outcome = out
        self.state.run_status = out.status
        if self.monitor is not None:
            self.monitor.stop(flush_last=False)  # the worker has ended: nobody reads a last window
            self.monitor = None
        for p in self.query(GpuPanel):
            # a run stopped elsewhere ends with its workers' clean exits: "ok" would say it finished
            healthy = p.status in (JobState.OK, JobState.RUNNING, JobState.PENDING, JobState.STOPPING)
            p.end((JobState(out.status) if out.status in (RunState.OK, RunState.STOPPED) else JobState.STOPPED)
                  if healthy else p.status)
        if self.last_snapshot is not None:  # the curve stays; the ETA goes
            self.query_one(LossChart).show(self.last_snapshot.progress, ended=True,
                                           width=max(20, self.query_one(LossChart).size.width - 12))
        status = Text(f"{out.status}: {out.message}", style=outcome_style(out.status))
        ev = self.launcher.metrics.progress.last_eval if self.launcher is not None else None  # the follower is done
        if ev is not None:
            status.append(f" · last eval loss {ev['eval_loss']:.4f} at step {ev.get('step')}", style="bold")
        self._status(status)
        if out.status == RunState.FAILED and out.failed_rank is not None:
            self.log_rank = out.failed_rank  # show what the failed node said
            self.notify(out.message, severity="error", title="Run failed", timeout=15)
        self.wizard.facts_changed()

    # ---------------------------------------------------------------- keys
    def action_next_node(self) -> None:
        if self.launcher is not None:
            self.log_rank = (self.log_rank + 1) % len(self.launcher.plan.nodes)
            self.query_one("#log-title", Label).update(f"Log: node {self.log_rank} (next update)")

    def action_stacks(self) -> None:
        """The stacks the last hang collected (the run directory's stacks/): what each rank answered, then the
        stacks of the ranks the hang blames, in a window to read and scroll."""
        from ...run.watch.stacks import read_collected

        snap = self.last_snapshot
        hangs = [n for n in (snap.notices if snap else ()) if n.kind == "HANG"]
        if not hangs:
            self.notify("no hang has been called in this run: its stacks are collected when one is", title="Stacks")
            return
        self.app.push_screen(Notice("Stacks of the last hang", read_collected(hangs[-1])))

    def action_chat(self) -> None:
        """A finished run's model, on its master (the launcher's transport to node 0)."""
        from ...run.tools.after import AfterRunError, locate
        from ..chat import ChatScreen

        if self.launcher is None or self.state.run_status != RunState.OK:
            self.notify("chat needs a run that finished training", severity="warning")
            return
        try:
            result = locate(self.launcher.run_dir.path)
        except AfterRunError as e:
            self.notify(str(e), severity="error", title="Chat")
            return
        self.app.push_screen(ChatScreen(result, self.launcher.transports[0]))

    def action_merge(self) -> None:
        """A finished LoRA run's adapter merged into its base on the master (OUTPUT_DIR/merged): the model a next
        stage (DPO on the merged model) or a chat takes."""
        from ...run.tools.after import AfterRunError, locate

        if self.launcher is None or self.state.run_status != RunState.OK:
            self.notify("merge needs a run that finished training", severity="warning")
            return
        try:
            result = locate(self.launcher.run_dir.path)
        except AfterRunError as e:
            self.notify(str(e), severity="error", title="Merge")
            return
        self.notify(f"merging {result.output_dir} into {result.preset.training.model} on node 0…", title="Merge")
        self._merge_worker(result)

    @work(thread=True, exclusive=True, exit_on_error=False, group="merge")
    def _merge_worker(self, result) -> None:
        from ...run.tools.after import AfterRunError, merge

        try:
            rep = merge(result, self.launcher.transports[0])
        except AfterRunError as e:
            self.app.call_from_thread(self.notify, str(e), severity="error", title="Merge", timeout=15)
            return
        text = rep["message"] if rep.get("merged_dir") is None else \
            f"merged into {rep['merged_dir']} ({rep['seconds']:.1f} s): a next stage (training.stage: dpo) can " \
            "start from it"
        self.app.call_from_thread(self.notify, text, title="Merge", timeout=15)

    def action_stop(self) -> None:
        if self.launcher is None and self.state.run_status == RunState.PENDING and self._job is not None:
            job = self._job.job_id

            def cancel(yes: bool | None) -> None:
                if yes:
                    self._stop_wanted = True  # the job's follower cancels it (scancel)
                    self._status(Text(f"cancelling SLURM job {job} (scancel)…", style=tone(WARNING)))

            self.app.push_screen(Confirm(f"Cancel SLURM job {job}?", "It leaves SLURM's queue (scancel); nothing "
                                         "of it has run yet.", yes="Cancel the job", danger=True), cancel)
            return
        if self.launcher is None or self.state.run_status != RunState.RUNNING:
            self.notify("nothing running")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self._status(Text("stopping every node…", style=tone(WARNING)))
                self._stop_wanted = True
                self.launcher.request_stop()

        self.app.push_screen(Confirm("Stop the run on every node?",
                                     "Every node's processes get SIGTERM, then SIGKILL after a grace period. "
                                     "Checkpoints already written stay.", yes="Stop all", danger=True), answer)
