"""The launch API: connect -> check -> plan -> launch -> follow -> stop, and attach, once for
every face. `qwen-tui replay`, `demo` and `attach` (cli/live.py draws them with rich) and the
wizard's Run screen (its workers post what they get as Messages) call these and only render
what comes back; neither writes its own sequence.

Each step is a function with a typed result: `Connections.connect`, `check`, `plan`, `start`,
`follow`, `stop`. `launch()` and `attach()` run the steps in order as generators of typed events
(the dataclasses below): Stage as each step begins, then what it found (Connected, Checked,
Planned), and last Started with the running Launcher, or a Failure that names the step, the
cause (per node where it is about nodes) and the fix. Nothing is raised for what a node or a
check can get wrong; a bug still raises. `follow()` yields a Snapshot per look at the run,
Stopping while a requested stop runs, and ends with Ended. A face that restarts a run calls
launch() again with the same Connections and a new run id (dataclasses.replace(req,
run_id=...)), then follow() again; relaunching a failed attempt is run/recovery/restarts.py's.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..base.levels import Level
from ..cluster.facts import ClusterFacts, NodeFacts
from ..nodes.results import NodeResults, on_nodes
from ..nodes.transport.protocol import Transport
from ..plan.launch import LaunchPlan, make_plan
from ..preset.files import load_preset, save_preset
from ..preset.schema import Preset
from .events import (
    AlreadyEnded,
    Checked,
    CheckProgress,
    CheckResult,
    Connected,
    Ended,
    Event,
    Failure,
    Planned,
    Snapshot,
    Stage,
    Started,
    Stopping,
)
from .launcher import Launcher, LaunchError, RunOutcome
from .rundir import RunDir, RunDirError, write_json_atomic
from .states import FINAL, JobState, RunState
from .watch.metrics import TrainingProgress
from .watch.notices import read_notices

if TYPE_CHECKING:  # paramiko behind it: the wizard imports this module before its first paint
    from ..nodes.checks.runner import Progress
    from ..nodes.keys import KeySetupReport
    from ..nodes.transport.hostkeys import Consent

# How long a person may take to answer a new host key question (the wizard's modal): a
# connect that may ask one is bounded by this on top of the connection's own bound.
CONSENT_WAIT_S = 300.0



# ---------------------------------------------------------------- connect

class Connections:
    """The open transports to a preset's nodes by node index: what a face keeps between the steps
    (the wizard for as long as the nodes stay the same, a command for one run). Thread-safe: the
    wizard's workers connect and read it from their own threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, Transport] = {}
        self._epoch = 0  # close() starts a new one: what a connect begun before it brings back is not kept

    def connect(self, preset: Preset, indices: list[int] | None = None, *, consent: Consent = False,
                password: str | None = None, on_progress: Callable[[int, str], None] | None = None,
                timeout: float | None = None) -> NodeResults:
        """Connect the nodes not connected yet, in parallel and bounded (nodes.results.on_nodes):
        node index -> Transport, or the exception that node raised (a NodeTimeout past the bound).
        A node that answers after the bound is closed, never kept half-known."""
        from ..nodes.connect import connect_bound, transport_for  # paramiko: not before the wizard's first paint

        nodes = preset.cluster.nodes
        labels = {i: n.label for i, n in enumerate(nodes)}
        asked = list(range(len(nodes))) if indices is None else list(indices)
        with self._lock:
            have = {i: self._open[i] for i in asked if i in self._open}
            epoch = self._epoch
        late = threading.Event()

        def one(i: int) -> Transport:
            if on_progress is not None:
                on_progress(i, "connecting")
            t = transport_for(nodes[i], preset, accept_new_host_keys=consent, password=password)
            if late.is_set():  # the caller has moved on: nobody would close it
                t.close()
                raise TimeoutError("connected after the bound")
            return t

        bound = timeout or connect_bound(preset) + (CONSENT_WAIT_S if callable(consent) else 0.0)
        got = on_nodes(one, [i for i in asked if i not in have], timeout=bound, labels=labels)
        late.set()
        with self._lock:
            for i, t in got.succeeded.items():
                if self._epoch != epoch:  # closed meanwhile (the nodes changed): these may be to old nodes
                    t.close()
                    got[i] = ConnectionAbortedError("the nodes changed while connecting; connect again")
                elif i in self._open:  # another worker connected it meanwhile: keep one
                    t.close()
                    got[i] = self._open[i]
                else:
                    self._open[i] = t
        return NodeResults({i: have[i] if i in have else got[i] for i in asked}, labels=labels)

    def transports(self) -> dict[int, Transport]:
        with self._lock:
            return dict(self._open)

    def get(self, i: int) -> Transport | None:
        with self._lock:
            return self._open.get(i)

    def close(self) -> None:
        """Close every connection (the nodes changed, or the face is done)."""
        with self._lock:
            open_, self._open = self._open, {}
            self._epoch += 1
        for t in open_.values():
            t.close()


def connect_failure(res: NodeResults, what: str = "not launched") -> Failure:
    """The Failure for nodes that could not be connected, one line and one fix per node."""
    from ..nodes.checks.findings import connect_fix

    failed = res.failed
    fixes = sorted({connect_fix(e) for e in failed.values()})
    return Failure("connect", f"{what}: every node must be reachable\n" + "\n".join(res.errors_text()),
                   "; ".join(fixes), nodes={i: f"{type(e).__name__}: {e}" for i, e in failed.items()})


# ---------------------------------------------------------------- check

def local_port_free(port: int, host: str = "") -> str | None:
    """None when a listener could bind `port` on this machine, else why not."""
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # as torch's TCPStore does: connections of an earlier run in TIME_WAIT must not count as busy
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
    except OSError as e:
        return f"port {port} is in use on this machine ({e.strerror})"
    finally:
        s.close()
    return None


def local_files_missing(preset: Preset) -> list:
    """On one machine the probe is skipped, but a missing data file or model is still an error before launch,
    not a worker's failure after it: each path as the worker will open it, from its node's workdir."""
    import os

    from ..advice.core import Advice, Fix
    from ..nodes.checks.probe import data_path, local_path

    out: list = []
    t = preset.training
    sources = [(f"datasets.{k}.{'path' if s.path else 'dataset_info'}", s.path or s.dataset_info)
               for k, s in enumerate(t.datasets or [])]  # a mixture's files, each where the worker opens it
    for kind, spec in (("data", t.data), ("eval_data", t.eval_data), *sources, ("model", t.model)):
        rel = local_path(spec) if kind == "model" else data_path(spec)
        if rel is None:  # builtin: or a hub id (fetched by the worker, or by check --sync)
            continue
        for i, n in enumerate(preset.cluster.nodes):
            path = os.path.abspath(os.path.join(os.path.expanduser(n.workdir), os.path.expanduser(rel)))
            if not os.path.exists(path):
                where = "" if os.path.isabs(os.path.expanduser(rel)) else f" (looked for {path}, from node {i}'s " \
                    f"workdir {n.workdir})"
                out.append(Advice(Level.ERROR, "MODEL_MISSING" if kind == "model" else "DATA_MISSING",
                                  f"training.{kind}: {spec} is not there on this machine{where}",
                                  Fix(f"Correct training.{kind}", hint=f"put the {kind} at {path}, or set "
                                      f"training.{kind} to where it is"), node=i))
                break  # one machine: said once
    return out


T = TypeVar("T")


def _with_progress(call: Callable[[Progress], T]) -> Generator[CheckProgress, None, T]:
    """Run `call(progress)` in a thread and yield what it reports as it comes; return its result
    (`x = yield from ...`). The node checks report from their own threads; this turns that into
    events a face reads in order. No bound here: every check inside carries its own."""
    q: queue.Queue = queue.Queue()
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call(lambda check, node, text: q.put(CheckProgress(check, node, text)))
        except BaseException as e:
            out["error"] = e
        finally:
            q.put(None)

    threading.Thread(target=run, name="node-checks", daemon=True).start()
    while (ev := q.get()) is not None:
        yield ev
    if "error" in out:
        raise out["error"]
    return out["result"]


def checking(preset: Preset, transports: dict[int, Transport], *, local_python: str,
             connect_errors: dict[int, BaseException] | None = None, bandwidth_seconds: float = 2.0,
             rehearsal: bool = True, on_one_machine: bool = False) -> Iterator[Event]:
    """The launch checks step by step: Stage and CheckProgress events, then one Checked.

    One machine: only a busy port can go wrong before launch (unless `on_one_machine`, as `qwen-tui
    check` asks: then its nodes get every check too). Several: the probe, port, firewall and
    bandwidth checks, then the rehearsal when those passed, every node answered and `rehearsal`.
    `connect_errors`: the nodes that could not be connected (reported as unreachable, not checked).
    The advice rules and the checks overlap (a missing data file is both); each (code, node) is
    said once."""
    from ..advice.rules import advise

    nodes = preset.cluster.nodes
    if all(n.is_local for n in nodes) and not on_one_machine:
        facts = ClusterFacts(master_port_free=local_port_free(preset.network.master_port) is None)
        advice = list(advise(preset, facts))
        said = {a.code for a in advice}
        yield Checked(CheckResult(facts, advice + [a for a in local_files_missing(preset) if a.code not in said]))
        return
    from ..nodes.checks.rehearsal import add_rehearsal
    from ..nodes.checks.runner import run_checks

    yield Stage("check", "checking the nodes (probe, ports, firewall, bandwidth)…")
    rep = yield from _with_progress(lambda say: run_checks(
        preset, transports, connect_errors=connect_errors, bandwidth_seconds=bandwidth_seconds,
        local_python=local_python, progress=say))
    if rehearsal and rep.ok and len(transports) == len(nodes):
        text = "rehearsal: rendezvous and all-reduce on every node…"
        yield Stage("rehearsal", text)
        yield CheckProgress("rehearsal", None, "rendezvous and all-reduce on every node")
        add_rehearsal(preset, transports, rep, local_python=local_python)
        for i in range(len(nodes)):
            v = rep.verdict(i, "rehearsal")
            yield CheckProgress("rehearsal", i, "passed" if v == "ok" else f"failed ({v})")
    advice = list(advise(preset, rep.facts))
    advised = {(a.code, a.node) for a in advice}
    findings = [f for f in rep.findings if f.level != Level.INFO and (f.code, f.node) not in advised]
    yield Checked(CheckResult(rep.facts, advice + findings, rep.to_dict(), rep))


def check(preset: Preset, transports: dict[int, Transport], *, local_python: str) -> CheckResult:
    """The launch checks in one call (what `checking` yields last)."""
    result = None
    for ev in checking(preset, transports, local_python=local_python):
        if isinstance(ev, Checked):
            result = ev.result
    assert result is not None  # checking() always ends with Checked
    return result


# ---------------------------------------------------------------- one step at a time (the wizard's keys)

def probe(preset: Preset, transport: Transport, index: int, *, local_python: str) -> NodeFacts:
    """Probe node `index` (Python stack, GPUs, data, disk) with the interpreter a run would use
    there; a missing python is a fact in the result (NodeFacts.error), not an exception."""
    from ..nodes.checks.probe import probe_node

    return probe_node(transport, preset, index, local_python=local_python)[0]


def network_check(preset: Preset, transports: dict[int, Transport], which: str,
                  facts: ClusterFacts) -> tuple[ClusterFacts, list]:
    """Run one network check again ("port", "firewall" or "bandwidth"), the one `checking` runs:
    a copy of `facts` with its fields measured afresh, and its findings (replace_findings puts
    them in place of the old ones)."""
    from ..nodes.checks.runner import run_network_check

    return run_network_check(preset, transports, which, facts)


def replace_findings(old: list, new: list, which: str) -> list:
    """The findings after network check `which` ran again: its columns' old findings go, the new come."""
    from ..nodes.checks.runner import replace_findings as replace

    return replace(old, new, which)


def sync(preset: Preset, transports: dict[int, Transport], facts: ClusterFacts, *,
         overwrite: bool = False) -> tuple[list[str], int]:
    """Copy the data, model and training code from the master to the nodes that lack them
    (checksum-verified, as `check --sync`; with `overwrite`, also the copies that differ): a line
    per node and kind, and how many differing copies were left as they were."""
    from ..nodes.sync import sync_from_master

    return sync_from_master(preset, transports, facts, overwrite=overwrite)


def setup_keys(preset: Preset, password: str | None, *, identity: str | None = None,
               consent: Consent = False) -> KeySetupReport:
    """Make (or use) the SSH key, install it on every remote node with `password` (memory only)
    and check every node pair: per-node results, never the first error. Raises KeyLocked when
    the key cannot be used at all."""
    from ..nodes.keys import setup_keys as setup

    return setup(preset, password, identity=identity, accept_new_host_keys=consent)


def host_key(transport: Transport) -> str:
    """The node's host key as `ssh-keygen -l` names it ("ssh-ed25519 SHA256:…"); "" for this machine."""
    return transport.host_key()


def master_transport(preset: Preset, conns: Connections) -> Transport | None:
    """Node 0's transport: this machine's own when node 0 is local (no connection needed), else
    its open connection (None until the nodes are connected)."""
    from ..nodes.transport.local import LocalTransport

    if preset.scheduler.is_slurm and not preset.cluster.nodes:  # a login node: the nodes' storage is shared
        return LocalTransport("this machine")
    master = preset.cluster.nodes[0]
    return LocalTransport(master.label) if master.is_local else conns.get(0)


def look_at_output_dir(preset: Preset, transport: Transport | None, *, base_dir: str, local_python: str,
                       facts: ClusterFacts | None = None) -> tuple[str | None, list[str] | None, str]:
    """What node 0's output directory holds before a launch, for the wizard's question: (the directory,
    its entries or None when it could not be looked at, why not). (None, None, "") when the run resumes
    (continuing a run there is the point). A missing directory holds nothing. Blocking, bounded by
    output_guard.LOOK_TIMEOUT_S."""
    import posixpath

    from ..nodes.transport.protocol import TransportError
    from .output_guard import look

    t = preset.training
    if t.resume_from_checkpoint:
        return None, None, ""
    node0 = make_plan(preset, run_id="look", local_run_dir="runs/look", base_dir=base_dir, facts=facts,
                      local_python=local_python).nodes[0]
    out = t.output_dir if posixpath.isabs(t.output_dir) else posixpath.join(node0.workdir, t.output_dir)
    if transport is None:
        return out, None, "node 0 is not connected yet"
    try:
        return out, look(transport, out), ""
    except TransportError as e:
        return out, None, str(e)


def preview_data(preset: Preset, transport: Transport, facts: ClusterFacts | None = None, *, base_dir: str,
                 local_python: str, bins: int = 16) -> dict[str, Any]:
    """The data preview on node 0 (`transport`: master_transport's): token counts and lengths by the
    worker's own tokenizer, timing from the estimate. Raises DataPreviewError (run/tools/data_preview.py)."""
    from .tools.data_preview import preview

    return preview(preset, transport, facts, base_dir=base_dir, local_python=local_python, bins=bins)


# ---------------------------------------------------------------- plan, start

def plan(preset: Preset, *, run_id: str, root: Path, base_dir: str, local_python: str,
         facts: ClusterFacts | None = None) -> LaunchPlan:
    """The LaunchPlan of a run `run_id` whose run directory is root/run_id."""
    return make_plan(preset, run_id=run_id, local_run_dir=str(root / run_id), base_dir=base_dir, facts=facts,
                     local_python=local_python)


def start(preset: Preset, plan_: LaunchPlan, transports: dict[int, Transport], facts: ClusterFacts,
          root: Path, check_report: dict | None = None, *, adopt: bool = False, attempt: int = 1) -> Launcher:
    """Record the run (plan, preset, facts, the check matrix) in a new run directory (with `adopt`, the one a
    SLURM submission made) and start every node as attempt `attempt`. Raises LaunchError (naming each node that
    did not start; the others are stopped)."""
    rd = RunDir.create(root, plan_.run_id, adopt=adopt)
    save_preset(preset, rd.path / "preset.yaml", mode=0o600)  # it may hold secrets (network.env)
    write_json_atomic(rd.path / "facts.json", facts.to_dict())
    if check_report is not None:
        write_json_atomic(rd.path / "check.json", check_report)
    la = Launcher(plan_, transports, rd, attempt=attempt)
    la.start()
    return la


@dataclass
class LaunchRequest:
    """What launch() needs besides the connections. `facts`: what the face knew before (the
    wizard's own checks); the launch checks' facts go over them. `consent`: whether (or whom to
    ask if) a new host key may be accepted."""

    preset: Preset
    root: Path
    run_id: str
    base_dir: str
    local_python: str
    force: bool = False
    skip_checks: bool = False
    facts: ClusterFacts | None = None
    consent: Consent = False
    password: str | None = None
    # refuse an output directory that holds another run's checkpoints or model (replay and demo; the wizard asks)
    guard_output: bool = False
    # but replace what earlier runs of this same preset name left there (the demo, run again where it ran before)
    replace_own_output: bool = False
    # a SLURM batch job: the run directory its submission made (adopt), and which attempt this is (after a requeue,
    # the next one: its logs and heartbeats apart from the earlier ones', as a relaunch's)
    adopt: bool = False
    attempt: int = 1


def launch(req: LaunchRequest, conns: Connections) -> Iterator[Event]:
    """connect -> check -> plan -> start, as events; the last is Started or a Failure."""
    p = req.preset
    yield Stage("connect", f"connecting {len(p.cluster.nodes)} node(s)…")
    res = conns.connect(p, consent=req.consent, password=req.password)
    if not res.ok:
        yield connect_failure(res)
        return
    yield Connected(dict(res.labels))
    transports = dict(res.succeeded)
    facts, report = req.facts or ClusterFacts(), None
    if not req.skip_checks:
        result: CheckResult | None = None
        for ev in checking(p, transports, local_python=req.local_python):
            if isinstance(ev, Checked):
                result = ev.result
            yield ev
        assert result is not None
        facts, report = facts.merged(result.facts), result.report
        if result.errors and not req.force:
            yield Failure("check", f"not launched: {len(result.errors)} error(s) in the checks\n" + "\n".join(
                f"{a.code}: {a.message}" for a in result.errors),
                "fix each one (its fix is listed with it), or launch anyway (replay --force)",
                nodes={a.node: a.message for a in result.errors if a.node is not None}, items=tuple(result.errors))
            return
    pl = plan(p, run_id=req.run_id, root=req.root, base_dir=req.base_dir, local_python=req.local_python,
              facts=facts)
    if req.attempt > 1:
        from .recovery.restarts import attempt_dirs

        attempt_dirs(pl, req.attempt)
    if req.guard_output:
        from .output_guard import FIX, guard
        from .rundir import run_slug

        own = run_slug(req.run_id) if req.replace_own_output else None
        refusal, note = guard(pl, p.training.resume_from_checkpoint, transports[0], own=own)
        if refusal is not None:
            yield Failure("output", refusal, FIX)
            return
        if note is not None:
            yield Stage("output", note)
    yield Planned(pl)
    yield Stage("launch", f"starting {pl.nnodes} node(s)…")
    try:
        la = start(p, pl, transports, facts, req.root, report, adopt=req.adopt, attempt=req.attempt)
    except LaunchError as e:
        yield Failure("launch", str(e), "the node's log says why (qwen-tui runs shows the run directory)",
                      nodes=dict(e.errors))
        return
    yield Started(la)


# ---------------------------------------------------------------- attach

def attach(run_dir: Path, conns: Connections, *, consent: Consent = False, password: str | None = None,
           on_preset: Callable[[Preset], None] | None = None) -> Iterator[Event]:
    """Find a run again from its run directory: AlreadyEnded, or Started with a Launcher that
    follows (and may stop) it, or a Failure. Never returns a launcher whose recorded pids do not
    prove to be this run's job. `on_preset(preset)` is called with the run's preset before
    connecting (the wizard shows it; conns must be for its nodes)."""
    rd = RunDir(Path(run_dir))
    try:
        pl = rd.read_plan()
        state = rd.read_state()
        rd.read_jobs(len(pl.nodes))
    except RunDirError as e:
        yield Failure("attach", f"cannot attach: {e}", "pass a run directory that qwen-tui created (qwen-tui runs)")
        return
    status = state.get("status")
    if status in FINAL:
        yield AlreadyEnded(pl.run_id, RunState(status), str(state.get("message", "")), tuple(read_notices(rd.path)))
        return
    try:
        preset = load_preset(rd.path / "preset.yaml")
    except (OSError, ValueError) as e:
        yield Failure("attach", f"cannot attach: {e}", "the run directory's preset.yaml is damaged")
        return
    if on_preset is not None:
        on_preset(preset)
    yield Stage("connect", f"connecting {len(preset.cluster.nodes)} node(s)…")
    res = conns.connect(preset, consent=consent, password=password)
    if not res.ok:
        yield connect_failure(res, "cannot attach")
        return
    yield Connected(dict(res.labels))
    yield Stage("attach", f"finding run {pl.run_id} on every node…")
    try:
        la = Launcher.attach(rd, dict(res.succeeded))
        refused = la.refusals()
    except RunDirError as e:
        yield Failure("attach", f"cannot attach: {e}", "pass a run directory that qwen-tui created (qwen-tui runs)")
        return
    if refused:
        lines = [f"node {r} ({la.nodes[r].label}): refusing to signal pid {la.nodes[r].pid}: {why}"
                 for r, why in sorted(refused.items())]
        yield Failure("attach", "cannot attach: the run directory does not describe processes of this run\n"
                      + "\n".join(lines), "nothing was signalled; look at the node's processes yourself",
                      nodes=dict(refused))
        return
    yield Started(la)


# ---------------------------------------------------------------- follow, stop

def _copy_progress(p: TrainingProgress) -> TrainingProgress:
    return TrainingProgress(start=p.start, end=p.end, steps=list(p.steps), events=list(p.events))


def snapshot(la: Launcher, log_rank: int | None = None, log_lines: int = 60) -> Snapshot:
    mon = la.monitor
    log: list[str] = []
    if log_rank is not None and mon.health.unreachable(log_rank):
        # a read would wait out its bound: the pane says why it is quiet, and reads on once the node answers
        log = [f"(node {log_rank} is unreachable: its log is read on when it answers again)"]
    elif log_rank is not None:
        try:
            log = la.log_tail(log_rank, lines=log_lines)
        except Exception as e:
            log = [f"(cannot read node {log_rank}'s log: {type(e).__name__}: {e})"]
    nodes = {r: (JobState.UNREACHABLE if s.status == JobState.RUNNING and mon.health.unreachable(r) else s.status,
                 s.error)
             for r, s in la.nodes.items()}
    notes = {r: n for r in la.nodes if (n := mon.note(r))}
    return Snapshot(nodes=nodes, progress=_copy_progress(la.metrics.progress), log=log, log_rank=log_rank,
                    notices=tuple(mon.copy()), notes=notes, hung=mon.hung_node)


def follow(la: Launcher, *, interval: float = 0.5, max_seconds: float | None = None,
           log_rank: Callable[[], int] | None = None, log_lines: int = 60,
           cancelled: Callable[[], bool] = lambda: False) -> Iterator[Snapshot | Stopping | Ended]:
    """Watch a running job: a Snapshot per look (every `interval` s), then Ended with the outcome.
    `la.request_stop()` (from any thread) stops every node, with a Stopping event every quarter
    second while it runs, and ends it as stopped; `max_seconds` stops it as failed. When
    `cancelled()` turns true (the face is closing) it returns without Ended: the job runs on, to be
    found again by attach. `log_rank()`: whose log tail to copy."""
    import time

    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    while True:
        if cancelled():
            return
        if la.stop_requested:
            stopped, _ = yield from _stopping(la)
            yield snapshot(la, log_rank() if log_rank else None, log_lines)
            yield Ended(stopped)
            return
        out = la.step(deadline=deadline, max_seconds=max_seconds)
        yield snapshot(la, log_rank() if log_rank else None, log_lines)
        if out is not None:
            yield Ended(out)
            return
        la.pause(interval)


def _stopping(la: Launcher, every: float = 0.25) -> Generator[Stopping, None, tuple[RunOutcome, list[int]]]:
    """Stop every node on a thread of its own and say how far each is while it runs; returns the
    outcome and the ranks where something survived (the generator's value)."""
    import time
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    labels = {c.rank: c.label for c in la.plan.nodes}
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stop") as ex:
        fut = ex.submit(la.stop_and_record)
        while True:
            yield Stopping(la.stop_progress(), labels, time.monotonic() - t0)
            try:
                res = fut.result(timeout=every)  # a bug in the stop raises here, on the follower's thread
            except FutureTimeout:
                continue
            yield Stopping(la.stop_progress(), labels, time.monotonic() - t0)  # each node's last word
            return res


@dataclass(frozen=True)
class Stopped:
    """stop()'s result: the outcome recorded, and the ranks where processes survived."""

    outcome: RunOutcome
    left: list[int]
    already_ended: bool = False


def stop(la: Launcher) -> Stopped:
    """Stop every node of a running job now and record it (a job that ended meanwhile is left alone)."""
    ended = la.poll()  # every node may have written its exit code since
    if ended is not None:
        return Stopped(ended, [], already_ended=True)
    out, left = la.stop_and_record()
    return Stopped(out, left)


def stopping(la: Launcher, every: float = 0.25) -> Generator[Stopping, None, Stopped]:
    """stop(), saying how far each node is while it runs (`res = yield from stopping(la)`)."""
    ended = la.poll()
    if ended is not None:
        return Stopped(ended, [], already_ended=True)
    out, left = yield from _stopping(la, every)
    return Stopped(out, left)
