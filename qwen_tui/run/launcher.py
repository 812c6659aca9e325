"""Run a LaunchPlan on its nodes and watch it until it ends.

Each node's torchrun starts as a detached job in its own process group (so it
survives qwen-tui and one signal reaches every rank), writing its log and, when
it ends, its exit code into the node's run directory. The Launcher polls those
exit-code files: the first node that fails, or whose job vanishes without one,
stops the whole run, and the node to blame is named (culprit.py). Stopping sends
SIGTERM to every node's group, then SIGKILL.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..nodes.checks.containers import remove as remove_container
from ..nodes.jobs import JobRef, Waiters, job_verdict, leader_alive, members, stop_job
from ..nodes.transport.protocol import Transport
from ..plan.launch import LaunchPlan, NodeCommand
from .culprit import Culprit
from .rundir import RunDir
from .states import JobState, RunState
from .watch.metrics import MetricsFollower
from .watch.monitor import RunMonitor


@dataclass
class NodeState:
    rank: int
    label: str
    status: JobState = JobState.PENDING
    pid: int | None = None
    start: int | None = None  # the job leader's start time, recorded at launch
    rc: int | None = None
    error: str | None = None
    cause: str | None = None  # set by the monitor when it gives up on the node (UNREACHABLE)


@dataclass
class RunOutcome:
    status: RunState  # ok | failed | stopped
    message: str
    failed_rank: int | None = None
    nodes: dict[int, NodeState] = field(default_factory=dict)
    cause: str | None = None  # the diagnosis code of the failed node's log (cluster/failures.py), if one matched

    def __post_init__(self) -> None:
        self.status = RunState(self.status)  # also when given as its word (an ended run's state.json)

    @property
    def exit_code(self) -> int:
        return self.status.exit_code


class LaunchError(RuntimeError):
    def __init__(self, message: str, errors: dict[int, str]):
        super().__init__(message)
        self.errors = errors


def _parallel(fn: Callable[[NodeCommand], object], cmds: list[NodeCommand]) -> dict[int, object]:
    """node rank -> result or the exception it raised (never just the first one)."""
    out: dict[int, object] = {}
    with ThreadPoolExecutor(max_workers=max(1, len(cmds))) as ex:
        futs = {c.rank: ex.submit(fn, c) for c in cmds}
        for rank, f in futs.items():
            try:
                out[rank] = f.result()
            except Exception as e:  # collected per node and reported by the caller
                out[rank] = e
    return out


def _attempt_of(state: dict) -> int:
    """The attempt a run directory's state.json describes (1 before any restart, or when unreadable)."""
    a = state.get("attempt", 1)
    return a if type(a) is int else 1


# How long a stopped worker may itself take to end (training/runtime/stop.py: node 0's first rank waits up to
# PEERS_BOUND_S
# for the other agents, and a rank whose collective lost a peer waits up to PEER_STOP_WAIT_S for its own signal);
# the stop's grace leaves it that and a margin before anything of the job gets a signal of its own.
WORKER_STOP_BOUND_S = 5.0 + 3.0
STOP_GRACE_S = WORKER_STOP_BOUND_S + 2.0
# A worker stopped while it still imports torch and its libraries ends only once those imports are done (an
# exception inside a C extension's import can crash it: training/runtime/stop.py), which took 9 s on a loaded 2-core
# machine; killed at the usual grace, its log lost the stop line to torchrun's traceback. Before training has
# started the stop waits this much longer for the workers to end on their own.
STARTING_EXTRA_S = 20.0


def _job_watch(plan: LaunchPlan):
    """A watch of the SLURM job that gave the plan its nodes (None over SSH)."""
    job = plan.scheduler.get("job_id") if plan.scheduler.get("kind") == "slurm" else None
    if not job:
        return None
    from ..nodes.slurm.job_watch import JobWatch

    return JobWatch(str(job), [c.host for c in plan.nodes])


class Launcher:
    def __init__(self, plan: LaunchPlan, transports: dict[int, Transport], run_dir: RunDir,
                 *, stop_grace: float = STOP_GRACE_S, attempt: int = 1, metrics_keep_at: int = 0):
        self.plan = plan
        self.transports = transports
        self.run_dir = run_dir
        self.stop_grace = stop_grace
        # which launch of this run directory this is (run/recovery/restarts.py relaunches after a failure);
        # a launcher whose attempt is over no longer writes the run's state
        self.attempt = attempt
        self.attempt_note: str | None = None  # one line about earlier attempts, for the views
        self.nodes = {c.rank: NodeState(c.rank, c.label) for c in plan.nodes}
        # a remote master's metrics are copied into the run directory as they are read (a
        # local master writes them there itself): the run keeps them after the node is gone
        kept = run_dir.path / "metrics.jsonl"
        local = os.path.realpath(plan.metrics_file) == os.path.realpath(kept)
        self.metrics = MetricsFollower(transports[0], plan.metrics_file, keep=None if local else str(kept),
                                       keep_at=metrics_keep_at)
        self._stop_requested = threading.Event()
        self._lock = threading.Lock()
        self._phases: dict[int, str] = {}  # rank -> where its stop is, while stop_all runs (stop_progress)
        self._phases_lock = threading.Lock()
        self.monitor = RunMonitor(self)
        self.culprit = Culprit(self)  # which node a failure blames (run/culprit.py)
        self._blamed: tuple | None = None  # the failure named at the last look, stopped at this one (poll)
        self.slurm = _job_watch(plan)  # SLURM's word on the job and its nodes, when SLURM gave them

    # ------------------------------------------------------------ start / attach
    def start(self) -> None:
        """Start every node; if any fails to start, stop the ones that did and raise."""
        self.run_dir.write_plan(self.plan)

        def go(c: NodeCommand) -> tuple[int, int | None]:
            t = self.transports[c.rank]
            pid = t.start_job(c.command, env=c.env, cwd=c.workdir, log=c.log_path, rcfile=c.rc_path,
                              run_id=self.plan.run_id)
            return pid, t.proc_start(pid)

        results = _parallel(go, self.plan.nodes)
        errors = {r: f"{type(v).__name__}: {v}" for r, v in results.items() if isinstance(v, Exception)}
        started = {r: v for r, v in results.items() if not isinstance(v, Exception)}
        for r, (pid, start) in started.items():
            self.nodes[r].pid, self.nodes[r].start, self.nodes[r].status = pid, start, JobState.RUNNING
        self.run_dir.write_pids({r: pid for r, (pid, _) in started.items()},
                                starts={r: start for r, (_, start) in started.items()})
        if errors:
            for r, e in errors.items():
                self.nodes[r].status, self.nodes[r].error = JobState.FAILED, e
            self.stop_all()
            names = ", ".join(f"node {r} ({self.nodes[r].label}): {e}" for r, e in errors.items())
            self.run_dir.write_state(status=RunState.FAILED, message=f"could not start {names}")
            raise LaunchError(f"could not start {names}", errors)
        self.run_dir.write_state(status=RunState.RUNNING, started=time.time(), run_id=self.plan.run_id,
                                 attempt=self.attempt)

    @classmethod
    def attach(cls, run_dir: RunDir, transports: dict[int, Transport]) -> "Launcher":
        """A launcher for a run started earlier. Raises RunDirError on a corrupt run directory.
        Nothing is signalled here; `refusals()` says which recorded pids are not provably ours."""
        from .runs import attempt_note

        plan = run_dir.read_plan()
        state = run_dir.read_state()
        keep_at = state.get("metrics_keep_at", 0)
        la = cls(plan, transports, run_dir, attempt=_attempt_of(state),
                 metrics_keep_at=keep_at if type(keep_at) is int and keep_at >= 0 else 0)
        la.attempt_note = attempt_note(state)
        la.monitor.earlier()  # what the view that launched it noticed: a hang before this attach, say
        for r, (pid, start) in run_dir.read_jobs(len(plan.nodes)).items():
            la.nodes[r].pid, la.nodes[r].start, la.nodes[r].status = pid, start, JobState.RUNNING
        return la

    def _ref(self, rank: int) -> JobRef | None:
        st = self.nodes[rank]
        return None if st.pid is None else JobRef(st.pid, st.start, self.plan.run_id)

    def refusals(self) -> dict[int, str]:
        """rank -> why its recorded pid must not be signalled, for every running node whose
        pid is alive but does not prove it is this run's job (qwen_tui.nodes.jobs)."""
        def judge(c: NodeCommand) -> tuple[str, str]:
            ref = self._ref(c.rank)
            if ref is None or self.nodes[c.rank].status != JobState.RUNNING:
                return "none", ""
            return job_verdict(self.transports[c.rank], ref)

        out = {}
        for r, v in _parallel(judge, self.plan.nodes).items():
            if isinstance(v, Exception):
                out[r] = f"cannot check pid {self.nodes[r].pid}: {v}"
            elif v[0] == "refused":
                out[r] = v[1]
        return out

    # ------------------------------------------------------------ watch
    def _check_node(self, c: NodeCommand) -> None:
        st = self.nodes[c.rank]
        if st.status not in (JobState.RUNNING,):
            return
        t = self.transports[c.rank]
        raw = t.read_file(c.rc_path).strip()
        if raw:
            st.rc = int(raw) if raw.lstrip(b"-").isdigit() else -1
            st.status = JobState.OK if st.rc == 0 else JobState.FAILED
            return
        ref = self._ref(c.rank)
        if ref is None:
            return
        procs = t.job_procs(ref.pid, ref.run_id)
        if leader_alive(ref, procs):
            return
        # the job shell is gone and left no exit code: killed from outside (or the node
        # rebooted). Ranks may live on without their agent; they are stopped with the rest.
        # Re-read in case the rc file landed between the two reads.
        raw = t.read_file(c.rc_path).strip()
        if raw:
            st.rc = int(raw) if raw.lstrip(b"-").isdigit() else -1
            st.status = JobState.OK if st.rc == 0 else JobState.FAILED
            return
        left = members(ref, procs)
        st.status = JobState.LOST
        st.error = (f"its job shell and torchrun agent (pid {ref.pid}) were killed, no exit code; "
                    f"{len(left)} orphaned process(es) of it left" if left else
                    "its processes were killed or the node went away (no exit code)")

    def poll(self) -> RunOutcome | None:
        """Refresh node states and metrics (run/watch/monitor.py: never decided from one failed read, never held
        up by a node that does not answer). Returns the outcome once the run is over.

        A failure is named at one look and the nodes are stopped at the next: the faces show the notices that
        named it first, not after a stop that waits out a connect timeout for each node that does not answer."""
        if self._blamed is not None:
            return self._end_failed(*self._blamed)
        self.monitor.look(self._check_node)
        said = self.slurm.look() if self.slurm is not None else None
        if said is not None:
            ended = self._slurm_says(said)
            if ended is not None:
                return ended
        if self.monitor.hang_action is not None and self.monitor.verdict is not None:
            return self._end_hung(self.monitor.verdict, self.monitor.hang_action)
        bad = [s for s in self.nodes.values() if s.status in (JobState.FAILED, JobState.LOST)]
        if bad and self._stopped_elsewhere():
            # another face (attach --stop, the wizard) stopped the run: its nodes end because they were stopped
            out = RunOutcome(RunState.STOPPED, "stopped by the user from another view of this run (qwen-tui attach "
                             "--stop, or the wizard); every node's processes are being ended there", None, self.nodes)
            self._record(out)
            return out
        if bad:
            found = self.culprit.find(bad)
            if found is None:
                return None  # survivors' errors only: the node that caused them shows itself within a grace
            self._blamed = self.culprit.agree(*found)
            return None
        if all(s.status == JobState.OK for s in self.nodes.values()):
            self._read_all_metrics()
            end = self.metrics.progress.end
            if end and end.get("status") == RunState.STOPPED:  # its workers were stopped (another view's stop-all)
                who = " by the user" if self._stopped_elsewhere() else ""
                out = RunOutcome(RunState.STOPPED, f"stopped{who} at step {end.get('step')}; every node's processes "
                                 "ended", None, self.nodes)
            elif end and end.get("status") != RunState.OK:
                out = RunOutcome(RunState.FAILED,
                                 f"training ended with status {end.get('status')}: {end.get('error', '')}",
                                 0, self.nodes, cause="TRAINING_ERROR")
            else:
                out = RunOutcome(RunState.OK, "training finished on every node", None, self.nodes)
            self._record(out)
            return out
        return None

    @property
    def failing(self) -> bool:
        """A failure was named at the last look; the next poll() stops every node and records it."""
        return self._blamed is not None

    def _end_failed(self, first, diag, tail) -> RunOutcome:
        """Stop every node and record the failure blamed on `first` (what the last look named)."""
        from ..cluster.failures import worker_error

        self._blamed = None
        self.stop_all()
        why = first.error or (f"exited with code {first.rc}" if first.rc is not None
                              else "failed (seen first by another view of this run)")
        msg = f"node {first.rank} ({first.label}) failed: {why}"
        said = worker_error(tail)
        if said is not None and diag is None:  # the worker refused its input: its own words say what
            msg += f": {said}"
        if diag is not None:
            msg += f"; cause: {diag.cause}; fix: {diag.fix}"
            if diag.code == "MACHINE_LOST":
                msg += f"\n  evidence: {diag.line}"
        if tail:
            msg += "\n  last log lines:\n" + "\n".join("    " + ln for ln in tail[-10:])
        cause = first.cause or (diag.code if diag else None)
        out = RunOutcome(RunState.FAILED, msg, first.rank, self.nodes, cause=cause)
        self._record(out)
        return out

    def _stopped_elsewhere(self) -> bool:
        """Whether a stop of this attempt was asked for in the run directory (stop_and_record writes it first)."""
        from .rundir import RunDirError

        try:
            state = self.run_dir.read_state()
        except RunDirError:
            return False
        asked = state.get("stop_requested")
        began = state.get("last_started") or state.get("started") or 0
        return isinstance(asked, (int, float)) and isinstance(began, (int, float)) and asked >= began

    def _read_all_metrics(self, rounds: int = 64) -> None:
        """Read the master's metrics to their end (a blip may have left more than one read's worth)."""
        self.monitor.wait_metrics()
        for _ in range(rounds):
            before = self.metrics.offset
            try:
                self.metrics.poll()
            except Exception as e:
                self.nodes[0].error = self.nodes[0].error or f"metrics: {type(e).__name__}: {e}"
                return
            if self.metrics.offset == before:
                return

    def _slurm_says(self, v) -> RunOutcome | None:
        """SLURM's verdict (run/slurm/job_watch.py) over what the reads guess: a node it took away is lost at once
        (the usual failure path blames it); a job it ended or requeued ends this attempt with its word."""
        if v.kind == "node":
            st = self.nodes[v.rank]
            if st.status == JobState.RUNNING:
                st.status, st.error, st.cause = JobState.LOST, v.text, "SLURM_NODE_DOWN"
            return None
        for st in self.nodes.values():
            if st.status == JobState.RUNNING:
                st.status = JobState.STOPPED
        if v.kind == "requeued":
            status = RunState.RESTARTING
        elif v.state == "COMPLETED":
            self._read_all_metrics()
            end = self.metrics.progress.end or {}
            status = RunState.OK if end.get("status") == RunState.OK else RunState.FAILED
        else:
            status = RunState.STOPPED if v.state == "CANCELLED" else RunState.FAILED
        text = f"training finished on every node ({v.text})" if status == RunState.OK else v.text
        out = RunOutcome(status, text, None, self.nodes, cause=f"SLURM_{v.state}")
        self._record(out)
        return out

    def _end_hung(self, v, action: str) -> RunOutcome:
        """The watchdog called a hang and the preset says stop (or stop and relaunch): end the attempt, blaming
        the culprit's node."""
        node = v.node if v.node in self.nodes else 0
        st = self.nodes[node]
        st.status, st.error = JobState.FAILED, v.text({c.rank: c.label for c in self.plan.nodes})
        self.stop_all()
        cause = "HANG" if action == "restart" else "HANG_STOPPED"
        hangs = [n for n in self.monitor.copy() if n.kind == "HANG"]
        where = hangs[-1].details.get("stacks") if hangs else None
        msg = f"node {node} ({st.label}) hung: {st.error}" + (f"; stacks in {where}" if where else "")
        out = RunOutcome(RunState.FAILED, msg, node, self.nodes, cause=cause)
        self._record(out)
        return out

    def _record(self, out: RunOutcome) -> None:
        self.monitor.close()  # the attempt is over: no more reads of its nodes
        if self.slurm is not None:
            self.slurm.close()
        if _attempt_of(self.run_dir.read_state()) != self.attempt:
            return  # an attached view of an attempt that replay has since relaunched: the state is the new one's
        self.run_dir.write_state(status=out.status, message=out.message, failed_rank=out.failed_rank,
                                 ended=time.time(),
                                 nodes={str(r): {"status": s.status, "rc": s.rc, "error": s.error}
                                        for r, s in out.nodes.items()})

    def step(self, *, deadline: float | None = None, max_seconds: float | None = None) -> RunOutcome | None:
        """One look at the run: its outcome once it has ended, else None. A requested stop ends it
        (every node stopped, recorded), and so does time.monotonic() passing `deadline` (the run's
        `max_seconds`, named in the message). What wait() and run.api.follow() repeat."""
        if self._stop_requested.is_set() and not self.failing:  # a failure already named is recorded as one
            return self.stop_and_record()[0]
        out = self.poll()
        if out is None and not self.failing and deadline is not None and time.monotonic() > deadline:
            self.stop_all()
            out = RunOutcome(RunState.FAILED, f"run did not finish within {max_seconds:g}s", None, self.nodes)
            self._record(out)
        return out

    def pause(self, seconds: float) -> None:
        """Sleep between looks; a stop request wakes it at once."""
        self._stop_requested.wait(seconds)

    def wait(self, *, interval: float = 0.5, on_update: Callable[["Launcher"], None] | None = None,
             max_seconds: float | None = None) -> RunOutcome:
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while True:
            out = self.step(deadline=deadline, max_seconds=max_seconds)
            if on_update:
                on_update(self)
            if out is not None:
                return out
            self.pause(interval)

    def request_stop(self) -> None:
        """Thread-safe: make wait() stop every node and return."""
        self._stop_requested.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    def stop_progress(self) -> dict[int, str]:
        """Thread-safe: rank -> the phase of its stop (jobs.stop_job's words), while stop_all runs."""
        with self._phases_lock:
            return dict(self._phases)

    def _phase(self, rank: int, text: str) -> None:
        with self._phases_lock:
            self._phases[rank] = text

    def stop_and_record(self) -> tuple[RunOutcome, list[int]]:
        """Stop every node, record the run as stopped; also the ranks where something survived. A SLURM batch job
        followed from outside it is cancelled instead (scancel): SLURM ends every step on every node."""
        # first, so that a replay following this run from elsewhere sees a stop, not a failure to relaunch
        self.run_dir.write_state(stop_requested=time.time())
        if self.slurm is not None and self.slurm.cancels_on_stop():
            return self._cancel_job()
        # a stop asked for before training started (as of the last look) waits for the workers' imports
        extra = STARTING_EXTRA_S if self.metrics.progress.start is None else 0.0
        left = [r for r, gone in self.stop_all(grace=self.stop_grace + extra).items() if not gone]
        msg = ("stopped by the user; every node's processes were ended" if not left
               else f"stopped by the user, but processes survive on node(s) {left}")
        out = RunOutcome(RunState.STOPPED, msg, None, self.nodes)
        self._record(out)
        return out, left

    def _cancel_job(self) -> tuple[RunOutcome, list[int]]:
        job = self.slurm.job_id
        with self._phases_lock:
            self._phases = {c.rank: f"SLURM cancels job {job} (scancel)" for c in self.plan.nodes}
        info = self.slurm.cancel(bound=STOP_GRACE_S + STARTING_EXTRA_S + 60)
        ended = info is None or info.ended
        for st in self.nodes.values():
            if st.status == JobState.RUNNING:
                st.status = JobState.STOPPED
        msg = (f"stopped by the user: SLURM job {job} cancelled (scancel); SLURM ended every step on every node"
               if ended else f"stopped by the user: SLURM job {job} cancelled, but SLURM still says "
               f"{info.state if info else '?'}")
        out = RunOutcome(RunState.STOPPED, msg, None, self.nodes, cause="SLURM_CANCELLED")
        self._record(out)
        return out, [] if ended else [c.rank for c in self.plan.nodes]

    # ------------------------------------------------------------ stop
    def stop_all(self, grace: float | None = None) -> dict[int, bool]:
        """Stop every node's process group in parallel (`grace`: how long the workers may take to end on their
        own; default the launcher's stop_grace). rank -> True when nothing is left."""
        grace = self.stop_grace if grace is None else grace
        waiters = Waiters()  # node 0's stop sees the waiter that the other nodes' agents wait for
        with self._lock:
            with self._phases_lock:
                self._phases = {c.rank: "stopping" for c in self.plan.nodes}

            def stop(c: NodeCommand) -> bool:
                ref = self._ref(c.rank)
                if ref is None:
                    self._phase(c.rank, "stopped (nothing was running)")
                    return True
                # only processes that prove they are this run's job are signalled
                gone = stop_job(self.transports[c.rank], ref, grace=grace,
                                on_phase=lambda text: self._phase(c.rank, text), waiters=waiters)
                if c.container:  # a stop that had to kill the runtime's client can leave its container behind
                    left = remove_container(self.transports[c.rank], c.container)
                    if left:
                        self._phase(c.rank, f"container left: {left}")
                        gone = False
                if self.nodes[c.rank].status == JobState.RUNNING:
                    self.nodes[c.rank].status = JobState.STOPPED
                return gone

            res = _parallel(stop, self.plan.nodes)
            for r, v in res.items():
                if isinstance(v, Exception):
                    self._phase(r, f"cannot stop: {type(v).__name__}: {v}")
        return {r: (v is True) for r, v in res.items()}

    def log_tail(self, rank: int, lines: int = 20, max_bytes: int = 64 * 1024) -> list[str]:
        """The last lines of a node's log, read on the node (only the tail crosses the wire)."""
        c = self.plan.nodes[rank]
        if self.monitor.health.unreachable(rank):  # a read would wait out its bound for nothing
            return [f"(node {rank} is unreachable: its log cannot be read now)"]
        try:
            res = self.transports[rank].run(["tail", "-c", str(max_bytes), c.log_path], timeout=15)
        except Exception as e:
            return [f"(cannot read node {rank}'s log: {type(e).__name__}: {e})"]
        return res.stdout.splitlines()[-lines:] if res.ok else []
