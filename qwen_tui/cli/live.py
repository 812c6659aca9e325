"""The headless face of a run, drawn with rich: `qwen-tui replay`, `demo` and `attach`.
It calls the launch API (run/api.py) and prints what it yields: the stages, the checks'
table, the plan, a live view of node states and the master's loss, the outcome."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..base.redact import printable, shown_env
from ..plan.launch import METRICS_NAME, LaunchPlan
from ..preset.files import load_preset
from ..run import api
from ..run.launcher import Launcher, RunOutcome
from ..run.rundir import default_runs_root, new_run_id
from ..run.states import JobState, RunState
from ..run.watch.gpuseries import NodeWatch, reports_to_tracker
from ..run.watch.metrics import fmt_duration, loss_summary, read_progress
from . import styles

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 40) -> str:
    if not values:
        return ""
    vals = values[-width:]
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    return "".join(_BARS[min(len(_BARS) - 1, int((v - lo) / span * (len(_BARS) - 1)))] for v in vals)


def render(la: Launcher) -> Group:
    prog = la.metrics.progress
    nodes = Table(title=f"run {la.plan.run_id}", expand=False)
    for col in ("node", "host", "procs", "status", "pid", "note"):
        nodes.add_column(col)
    for c in la.plan.nodes:
        st, mon = la.nodes[c.rank], la.monitor
        status = JobState.UNREACHABLE if st.status == JobState.RUNNING and mon.health.unreachable(c.rank) else st.status
        note = st.error or mon.note(c.rank) or (f"rc {st.rc}" if st.rc is not None else "")
        shown = Text(status, style=styles.JOB.get(status, ""))
        if status == JobState.RUNNING and mon.hung_node == c.rank:  # running, and holding every other node
            shown = Text("hung", style=styles.JOB.get(JobState.FAILED, ""))
        nodes.add_row(str(c.rank), c.label, str(c.nproc), shown, str(st.pid or "-"), Text(printable(note)))
    last = prog.last or {}
    total = prog.total_steps
    step = last.get("step", 0)
    line = Text()
    line.append(f"step {step}/{total or '?'}  ")
    if "loss" in last:
        first = prog.losses[0] if prog.losses else last["loss"]
        line.append(f"loss {last['loss']:.4f} (first {first:.4f})  ")
    ev = prog.last_eval
    if ev is not None:
        line.append(f"eval loss {ev['eval_loss']:.4f} (step {ev.get('step', '?')})  ", style="bold")
    if "learning_rate" in last:
        line.append(f"lr {last['learning_rate']:.2e}  ")
    if "tokens_per_second" in last:
        line.append(f"{last['tokens_per_second']:.0f} tok/s  ")
    hung = la.monitor.hung_node if la.plan.nodes else None
    line.append("ETA unknown (hung)" if hung is not None else f"ETA {fmt_duration(prog.eta_seconds())}")
    parts: list = [nodes, line]
    if la.attempt_note:  # a relaunch after a failure (run/recovery/restarts.py)
        parts.insert(1, Text(la.attempt_note, style=styles.WARN_STRONG))
    if prog.preference:  # DPO: the rewards beside the loss
        parts.insert(parts.index(line) + 1, Text(prog.preference))
    if prog.losses:
        parts.append(Text("loss " + sparkline(prog.losses), style=styles.CURVE))
    if prog.start is None:
        parts.append(Text("waiting for every node to join the rendezvous and the worker to start…", style="dim"))
    return Group(*parts)


def say_notices(notices, shown: int, console: Console) -> int:
    """Print the notices after the first `shown` (a node unreachable and back, a hang, a straggler); how many
    are printed now in all."""
    for n in notices[shown:]:
        stamp = time.strftime("%H:%M:%S", time.localtime(n.at)) if n.at else "--:--:--"
        # one line whatever its length (the terminal wraps it): a log of replay keeps each notice whole
        console.print(Text(f"{stamp} {printable(n.text)}", style=styles.level_style(n.level)), soft_wrap=True)
    return max(shown, len(notices))


def say_stop_phases(ev: api.Stopping, said: dict[int, str], console: Console) -> None:
    """Print each node's stop phase once, as it changes (`said` remembers what was printed)."""
    for r, what in sorted(ev.nodes.items()):
        if said.get(r) != what:
            said[r] = what
            console.print(Text(f"stopping: node {r} ({ev.labels.get(r, '?')}) {what}", style=styles.WARN))


class Detached(Exception):
    """The user detached from a run it follows (the run goes on): `qwen-tui attach RUN` finds it again."""

    def __init__(self, run_id: str):
        super().__init__(run_id)
        self.run_id = run_id


DETACH_KEY = "d"  # and Ctrl-\ (SIGQUIT), which works where keys cannot be read (no terminal on stdin)


def watch_keys(on_key) -> contextlib.AbstractContextManager:
    """While following on a terminal: read single keys from stdin (cbreak: no echo, Ctrl-C still a signal) and
    hand each to `on_key`; the terminal's mode comes back on exit. Elsewhere (stdin a pipe or a file) nothing
    is read: Ctrl-\\ still detaches."""

    @contextlib.contextmanager
    def cm():
        try:
            fd = sys.stdin.fileno()
            # in the terminal's foreground only: a background job that changes the terminal's mode is stopped
            interactive = os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
        except (AttributeError, OSError, ValueError):
            interactive = False
        if not interactive:
            yield
            return
        import select
        import termios
        import tty

        saved = termios.tcgetattr(fd)
        done = threading.Event()

        def read() -> None:
            while not done.is_set():
                if select.select([fd], [], [], 0.2)[0]:
                    try:
                        ch = os.read(fd, 1).decode(errors="replace")
                    except OSError:
                        return
                    if not ch:
                        return
                    on_key(ch)

        tty.setcbreak(fd)
        reader = threading.Thread(target=read, name="follow-keys", daemon=True)
        reader.start()
        try:
            yield
        finally:
            done.set()
            reader.join(timeout=1.0)
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)

    return cm()


def follow(la: Launcher, console: Console | None = None, *, interval: float = 0.5,
           max_seconds: float | None = None, ctrl_c: str = "stop") -> RunOutcome:
    """Watch until the run ends (api.follow). `ctrl_c`: "stop" (replay, which launched the run: Ctrl-C or SIGTERM
    stops every node of the run, and says so) or "detach" (attach: they leave the run going, as `tail -f` and
    `kubectl logs -f` do). `d` or Ctrl-\\ always detaches: Detached is raised and the run goes on."""
    console = console or Console()
    detach = threading.Event()
    by_signal: list[str] = []  # what stopped the run from here, said once the stop begins

    def _on_signal(signum, frame):
        if signum == signal.SIGQUIT or ctrl_c == "detach":
            detach.set()
        elif not la.stop_requested:
            by_signal.append("Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name)
            la.request_stop()

    def _on_key(ch: str) -> None:
        if ch.lower() == DETACH_KEY:
            detach.set()

    run_id = la.plan.run_id
    # how `attach` finds it: the id in the default runs root, else the directory
    ref = run_id if la.run_dir.path.parent == default_runs_root() else str(la.run_dir.path)
    if ctrl_c == "detach":
        hint = (f"Ctrl-C, {DETACH_KEY} or Ctrl-\\ detaches (the run goes on); "
                f"qwen-tui attach {ref} --stop stops it")
    else:
        hint = (f"Ctrl-C stops the run on every node; {DETACH_KEY} or Ctrl-\\ detaches (the run goes on: "
                f"qwen-tui attach {ref})")
    hint_text = Text(hint, style="dim")
    old = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)}
    out: RunOutcome | None = None
    # A worker that reports to a tracker gets every node's GPU load from the monitor (run.watch.gpuseries).
    watch = NodeWatch(la) if la.plan.nodes and reports_to_tracker(la.plan.nodes[0].argv) else None
    if watch is not None:
        watch.start()
    try:
        said: dict[int, str] = {}  # each node's stop phase, printed as it changes
        shown = 0  # notices printed so far
        with watch_keys(_on_key), \
                Live(Group(render(la), hint_text), console=console, refresh_per_second=4, transient=False) as live:
            for ev in api.follow(la, interval=interval, max_seconds=max_seconds, cancelled=detach.is_set):
                if isinstance(ev, api.Stopping):  # a stop takes seconds: say where each node is
                    if by_signal:
                        console.print(Text(f"{by_signal.pop()}: stopping run {run_id} on every node (it was "
                                           f"launched here; {DETACH_KEY} or Ctrl-\\ would have left it running)",
                                           style=styles.WARN_STRONG))
                    say_stop_phases(ev, said, console)
                    live.update(Group(render(la), Text(ev.text, style=styles.WARN)))
                    continue
                if isinstance(ev, api.Snapshot):
                    shown = say_notices(ev.notices, shown, console)
                live.update(Group(render(la), hint_text) if not isinstance(ev, api.Ended) else render(la))
                if isinstance(ev, api.Ended):
                    out = ev.outcome
        console.print()
    finally:
        if watch is not None:
            watch.stop(flush_last=False)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if out is None and detach.is_set():
        console.print(Text(f"detached from run {run_id}; it goes on. qwen-tui attach {ref} follows it again, "
                           f"qwen-tui attach {ref} --stop stops it", style="bold"))
        raise Detached(run_id)
    assert out is not None  # follow() ends with Ended unless cancelled, and nothing cancels it here
    console.print(Text(out.message, style=styles.outcome_style(out.status)))
    if out.failed_rank is not None and "last log lines" not in out.message:  # the outcome has them already
        console.print(f"last lines of node {out.failed_rank} ({la.plan.nodes[out.failed_rank].label}):")
        for ln in la.log_tail(out.failed_rank, 15):
            console.print("  " + ln, markup=False, highlight=False)
    for line in loss_summary(la.metrics.progress):
        console.print(line, markup=False, highlight=False)
    return out


# ---------------------------------------------------------------- replay / demo / attach

def print_plan(plan: LaunchPlan, console: Console, full: bool = True) -> None:
    """The launch plan. full: every node's environment and command line (--dry-run, or replay -v); else one line
    a node, so the live view is not preceded by forty lines of environment."""
    console.print(f"[bold]plan {plan.run_id}[/]: {plan.nnodes} nodes, world size {plan.world_size}, "
                  f"backend {plan.backend}, master {plan.master_addr}:{plan.master_port}")
    console.print(f"effective batch size: {plan.batch_formula}")
    for c in plan.nodes:
        if not full:
            iface = c.env.get("NCCL_SOCKET_IFNAME") or c.env.get("GLOO_SOCKET_IFNAME")
            console.print(printable(f"  node {c.rank}: {c.label}" + (" (local)" if c.local else "")
                                    + f", {c.nproc} process(es), workdir {c.workdir}"
                                    + (f", interface {iface}" if iface else "")), markup=False, highlight=False)
            continue
        console.rule(escape(f"node {c.rank}: {c.label}" + (" (local)" if c.local else "")))
        for k, v in shown_env(c.env).items():  # secrets as ***, control characters escaped
            console.print(f"  {k}={v}", markup=False, highlight=False)
        console.print("  " + c.shell_line(), markup=False, highlight=False, soft_wrap=True)
    if not full:
        argv = plan.nodes[0].argv if plan.nodes else []

        def flag(name: str) -> str | None:
            i = argv.index(name) if name in argv else -1
            return argv[i + 1] if 0 <= i < len(argv) - 1 else None

        # the user's own values: escaped, never markup
        console.print(printable(f"  model {flag('--model_name_or_path')}, data {flag('--data_path')}"),
                      markup=False, highlight=False)
        console.print("  (each node's environment and command: add -v, or replay --dry-run)", style="dim")
    from ..plan.outputs import plan_places

    console.rule("checkpoints and final model")
    for rank, label, where in plan_places(plan):
        console.print(f"  node {rank} ({label}): {where}", markup=False, highlight=False)


def print_advice(advice: Iterable, console: Console) -> None:
    advice = list(advice)
    if not advice:
        console.print(f"[{styles.GOOD}]checks: nothing to warn about[/]")
        return
    t = Table(title="checks and advice")
    for col in ("level", "code", "message", "fix"):
        t.add_column(col)
    for a in advice:
        fix = getattr(a.fix, "label", a.fix) if a.fix else ""
        # Text, not markup: messages carry user values (paths, hosts); control characters escaped
        t.add_row(f"[{styles.level_style(a.level)}]{a.level}[/]", a.code, Text(printable(a.message)),
                  Text(printable(str(fix or ""))))
    console.print(t)


def print_failure(f: api.Failure, console: Console) -> None:
    for line in f.cause.splitlines():  # one line at a time: each line's control characters escaped
        console.print(Text(printable(line), style=styles.BAD))
    if f.fix:
        console.print(Text("fix: " + printable(f.fix), style=styles.WARN))


def prepare_and_launch(preset_path: str, *, dry_run: bool, runs_root: str | None, accept_new_host_keys: bool,
                       force: bool, skip_checks: bool, max_seconds: float | None,
                       exclude_failed: bool = False, verbose: bool = False, overwrite_output: bool = False,
                       replace_own_output: bool = False, run_id: str | None = None) -> int:
    """`qwen-tui replay` and `demo`: the launch API's events, printed; then the live view, through
    every relaunch that training.restarts allows (run/recovery/restarts.py). replace_own_output: the output left by an
    earlier run of the same preset is replaced, not refused (the demo run again). A SLURM preset runs on the
    allocation this process is in (a login node submits it instead: cli/slurm_batch.py); `run_id`: the run
    directory to use (the batch job of a submitted run takes over the one its submission made)."""
    console = Console(stderr=False)
    preset = load_preset(preset_path)
    root = Path(runs_root).absolute() if runs_root else default_runs_root()
    adopt, attempt = False, 1
    if preset.scheduler.is_slurm and not preset.cluster.nodes:
        from . import slurm_inside

        job = slurm_inside.allocation_id()
        if job is None:  # the command submits it from a login node instead (cli/slurm_batch.py)
            console.print(Text("not launched: a SLURM preset runs inside an allocation (salloc), or is submitted "
                               "with qwen-tui replay", style=styles.BAD))
            return 1
        preset = slurm_inside.in_allocation(preset, job, console)
        if preset is None:
            return 1
        if run_id is not None:
            preset, adopt, attempt = slurm_inside.take_over_run_dir(preset, root, run_id, console)
    req = api.LaunchRequest(preset, root, run_id or new_run_id(preset.name or Path(preset_path).stem),
                            base_dir=os.getcwd(), adopt=adopt, attempt=attempt,
                            local_python=sys.executable, force=force, skip_checks=skip_checks,
                            consent=accept_new_host_keys, guard_output=not overwrite_output,
                            replace_own_output=replace_own_output)
    if dry_run:
        print_plan(api.plan(preset, run_id=req.run_id, root=root, base_dir=req.base_dir,
                            local_python=req.local_python), console)
        return 0
    conns = api.Connections()
    # Ctrl-C (or SIGTERM) before the live view: while connecting and checking nothing runs yet, so it ends here
    # at once; once the nodes start, it is noted and the run is stopped as soon as it is known (follow()'s own
    # handler takes over from there). Without this a Ctrl-C between the start and the live view left the run going.
    early: dict = {"starting": False, "la": None, "signal": None}

    def _early(signum, frame):
        if not early["starting"]:
            raise KeyboardInterrupt
        early["signal"] = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if early["la"] is not None:
            early["la"].request_stop()

    old = {sig: signal.signal(sig, _early) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        la, labels = None, {}
        for ev in api.launch(req, conns):
            if isinstance(ev, api.Connected):
                labels = ev.labels
            elif isinstance(ev, api.Stage) and ev.name in ("check", "rehearsal", "output"):
                console.print(ev.text)
            elif isinstance(ev, api.Stage) and ev.name == "launch":
                early["starting"] = True
            elif isinstance(ev, api.CheckProgress) and ev.node is not None:
                # each node's outcome as it comes: checks of a slow cluster take tens of seconds
                console.print(f"  {escape(ev.check)}: node {ev.node} ({escape(str(labels.get(ev.node, '?')))}): "
                              f"{escape(ev.text)}", style="dim", highlight=False)
            elif isinstance(ev, api.Checked):
                print_advice(ev.result.items, console)
            elif isinstance(ev, api.Planned):
                print_plan(ev.plan, console, full=verbose)
            elif isinstance(ev, api.Failure):
                print_failure(ev, console)
                return 1
            elif isinstance(ev, api.Started):
                la = early["la"] = ev.launcher
        assert la is not None  # launch() ends with Started or a Failure
        if early["signal"] is not None:
            la.request_stop()
            console.print(Text(f"{early['signal']} while starting: stopping run {la.plan.run_id} on every node",
                               style=styles.WARN_STRONG))
        console.print(f"run directory: {la.run_dir.path}  (re-attach: qwen-tui attach {la.run_dir.path})")
        from ..run.recovery.restarts import Restarts, run_facts

        rs = Restarts(preset, la.transports, run_facts(la.run_dir),
                      exclude_failed=exclude_failed or preset.training.exclude_failed,
                      base_dir=req.base_dir, local_python=req.local_python, say=console.print)
        current = {"la": la}  # the attempt being followed (a relaunch makes another)

        def follow_one(a: Launcher, left: float | None) -> RunOutcome:
            current["la"] = a
            return follow(a, console, max_seconds=left)

        warning = None
        if preset.scheduler.is_slurm:  # SLURM's time-limit warning: a checkpoint, then the job is requeued
            from .slurm_inside import TimeWarning

            warning = TimeWarning(preset, lambda: current["la"], console).install()
        try:
            out = rs.follow(la, follow_one, max_seconds=max_seconds)
            if warning is not None:
                warning.after(out)
            return out.exit_code
        except Detached:
            return 0
        finally:
            if warning is not None:
                warning.uninstall()
    except KeyboardInterrupt:
        console.print(Text("Ctrl-C before launch: nothing was started", style=styles.WARN))
        return 130
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        conns.close()


def take_over(la: Launcher, out: RunOutcome, console: Console) -> int:
    """`attach` drives the run (its launching face is gone; driver.claim made this face the driver): relaunch
    after the failed attempt `la` as replay would, and follow every attempt until the run ends."""
    from ..run.recovery import driver
    from ..run.recovery.restarts import Restarts

    try:
        rs = Restarts.from_run_dir(la, say=console.print)
    except (OSError, ValueError) as e:
        driver.release(la.run_dir)
        console.print(Text(f"cannot relaunch run {la.plan.run_id}: {printable(str(e))}", style=styles.BAD))
        return out.exit_code
    try:
        return rs.take_over(la, out, lambda a, left: follow(a, console, max_seconds=left, ctrl_c="detach")).exit_code
    except Detached:
        return 0


def attach(run_dir: str, *, accept_new_host_keys: bool, stop: bool) -> int:
    """`qwen-tui attach`: follow (or stop) a run from its run directory. Never signals a process
    that does not prove it is this run's job, and never signals a run that has ended."""
    console = Console()
    conns = api.Connections()
    try:
        for ev in api.attach(Path(run_dir), conns, consent=accept_new_host_keys):
            if isinstance(ev, api.AlreadyEnded):
                say_notices(ev.notices, 0, console)
                what = "nothing to stop" if stop else "nothing to follow"
                console.print(f"run {ev.run_id} already ended ({ev.status}): {ev.message}; {what}",
                              markup=False, highlight=False)
                # what it trained, from the run directory's copy of the master's metrics
                for line in loss_summary(read_progress(Path(run_dir) / METRICS_NAME)):
                    console.print(line, markup=False, highlight=False)
                return 0 if stop else ev.status.exit_code
            if isinstance(ev, api.Failure):
                print_failure(ev, console)
                return 2 if ev.stage == "attach" and not ev.nodes else 1
            if isinstance(ev, api.Started):
                la = ev.launcher
                if not stop:
                    try:
                        out = follow(la, console, ctrl_c="detach")
                    except Detached:
                        return 0
                    if out.status == RunState.FAILED:
                        from ..run.recovery.restarts import next_or_take_over

                        what, nxt = next_or_take_over(la.run_dir, la.attempt)
                        if what == "next":  # the run's driver relaunched it: follow the new attempt (its own nodes)
                            console.print(f"run {la.plan.run_id}: attempt {nxt} started; following it")
                            conns.close()
                            return attach(run_dir, accept_new_host_keys=accept_new_host_keys, stop=False)
                        if what == "drive":  # no live face drives the run: this one relaunches it
                            return take_over(la, out, console)
                    return out.exit_code
                said: dict[int, str] = {}
                stopping = api.stopping(la)
                while True:  # a stop takes seconds: each node's phase as it changes
                    try:
                        ev = next(stopping)
                    except StopIteration as done:
                        res = done.value
                        break
                    say_stop_phases(ev, said, console)
                if res.already_ended:
                    console.print(f"run {la.plan.run_id} already ended ({res.outcome.status}): "
                                  f"{res.outcome.message}; nothing to stop", markup=False, highlight=False)
                    return 0
                if res.left:
                    console.print(f"[{styles.BAD}]processes left on node(s) {res.left}[/]")
                    return 1
                console.print(res.outcome.message)
                return 0
        raise AssertionError("attach() ended without a result")  # it always ends with one of the above
    finally:
        conns.close()
