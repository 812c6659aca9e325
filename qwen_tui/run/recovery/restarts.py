"""Recovery: relaunch a failed run from its last complete checkpoint.

`training.restarts: N` allows N relaunches after a node fails; `training.exclude_failed`
(or `qwen-tui replay --exclude-failed`) leaves the failed node out of them, with the
batch re-split so that the global batch stays (run/recovery/attempts.py says when it cannot).
Each relaunch is another attempt of the same run directory:

- the failed attempt's processes are stopped on every node that stays (a survivor
  refuses the relaunch, so no two attempts ever train at once);
- the checkpoint is the newest step that every node that stays holds complete
  (without shared storage each node resumes from its own copy);
- the attempt's node logs and exit codes go to `attempt-K/` under each node's run
  directory; the master's metrics.jsonl keeps growing (the worker appends), so the
  loss of every attempt is one record;
- state.json lists the attempts (nodes, batch, checkpoint, how each ended), and
  plan.json / pids.json / preset.yaml describe the current one, which is what
  `qwen-tui attach` follows (preset.first.yaml keeps the preset as first launched).

The face that relaunches is the run's driver (run/recovery/driver.py): the one that launched it
(`Restarts.follow`), or an attach that finds it gone after a failed attempt
(`next_or_take_over`, then `Restarts.from_run_dir(...).take_over`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import shutil
import sys
import time
from collections.abc import Callable

from ...cluster.facts import ClusterFacts
from ...nodes.programs import program
from ...nodes.transport.protocol import Transport, TransportError
from ...plan.launch import LaunchPlan, NodeCommand, make_plan
from ...preset.files import load_preset, save_preset
from ...preset.schema import Preset
from ..launcher import Launcher, LaunchError, RunOutcome
from ..rundir import RunDir
from ..runs import attempt_note
from ..states import JobState, RunState
from ..watch.blame import MACHINE_LOST
from . import driver
from .attempts import RestartRefused, common_checkpoint, recovery_notes, why_not_restart, without_nodes

# Lists the checkpoints in $1, whole ones by name and incomplete ones with why (their manifest checked); no Python
# needed on the node.
_LIST_CHECKPOINTS = program("list_checkpoints.sh")
NEXT_ATTEMPT_BOUND = 120.0  # how long `attach` waits for replay to start the next attempt

FollowOne = Callable[[Launcher, float | None], RunOutcome]


def run_facts(rd: RunDir) -> ClusterFacts | None:
    """What the launch checks learned (facts.json), for the plans of the relaunches; None without it."""
    try:
        return ClusterFacts.from_dict(json.loads((rd.path / "facts.json").read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None


def _facts_for(rd: RunDir, state: dict, plan: LaunchPlan) -> ClusterFacts | None:
    """facts.json keyed by the current attempt's ranks: it holds the first launch's, and a relaunch without a
    failed node renumbers the nodes that stay (matched by their labels, as the attempts list them)."""
    facts = run_facts(rd)
    attempts = state.get("attempts")
    first = attempts[0].get("nodes") if isinstance(attempts, list) and attempts and isinstance(attempts[0], dict) \
        else None
    if facts is None or not isinstance(first, list):
        return facts
    ranks = {i: first.index(c.label) for i, c in enumerate(plan.nodes) if first.count(c.label) == 1}
    return dataclasses.replace(facts, nodes={i: facts.nodes[r] for i, r in ranks.items() if r in facts.nodes})


def list_checkpoints(t: Transport, cmd: NodeCommand, output_dir: str,
                     skipped: list[str] | None = None) -> list[str]:
    """The complete checkpoint directories' names in output_dir on one node (its workdir is the cwd); `skipped`
    gets one line for each incomplete one, saying why."""
    r = t.run(["sh", "-c", _LIST_CHECKPOINTS, "sh", output_dir], timeout=120, cwd=cmd.workdir)
    if not r.ok:
        raise RestartRefused(f"node {cmd.rank} ({cmd.label}): cannot list the checkpoints in {output_dir}: "
                             f"{(r.stderr or r.stdout).strip()[:300]}")
    lines = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
    if skipped is not None:
        skipped += [f"node {cmd.rank} ({cmd.label}): {ln[2:]}" for ln in lines if ln.startswith("# ")]
    return [ln for ln in lines if not ln.startswith("#")]


def _attempt_heartbeats(c: NodeCommand, attempt: int) -> None:
    """The worker's --heartbeat_dir moved under attempt-K/ with the node's run directory: the monitor reads the
    heartbeats and stacks at c.heartbeat_dir (under c.run_dir), and a relaunch must not find the last attempt's."""
    i = c.argv.index("--heartbeat_dir") + 1
    head, name = posixpath.split(c.argv[i])
    c.argv[i] = posixpath.join(head, f"attempt-{attempt}", name)


def attempt_dirs(plan: LaunchPlan, attempt: int) -> None:
    """Attempt `attempt`'s logs, exit codes and heartbeats apart from the earlier attempts' (in the plan)."""
    for c in plan.nodes:
        c.run_dir = posixpath.join(c.run_dir, f"attempt-{attempt}")
        _attempt_heartbeats(c, attempt)


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


class Restarts:
    """Follows a run through its attempts. `preset`, `transports` and `facts` are those of the launcher
    passed to `follow`; `say` prints one line for the user."""

    def __init__(self, preset: Preset, transports: dict[int, Transport], facts: ClusterFacts | None,
                 *, exclude_failed: bool, base_dir: str, local_python: str | None,
                 say: Callable[[str], None] = print):
        self.preset, self.transports, self.facts = preset, transports, facts
        self.exclude_failed = exclude_failed
        self.allowed = preset.training.restarts
        self.base_dir, self.local_python, self.say = base_dir, local_python, say
        self.made = 0
        self.excluded: list[str] = []  # labels of the nodes left out so far

    @classmethod
    def from_run_dir(cls, la: Launcher, *, say: Callable[[str], None] = print) -> "Restarts":
        """For a face that takes the run over (take_over) from `la`, a launcher attached to its current attempt:
        the preset (preset.yaml), the facts (facts.json), exclude_failed, the restarts allowed and made and the
        nodes left out so far (state.json), and where the launching face planned from. Raises OSError or
        ValueError for a damaged preset.yaml."""
        rd = la.run_dir
        state = rd.read_state()
        preset = load_preset(rd.path / "preset.yaml")
        rel = state.get("relaunch") if isinstance(state.get("relaunch"), dict) else {}
        base_dir = rel.get("base_dir") if isinstance(rel.get("base_dir"), str) else os.getcwd()
        local_python = rel.get("local_python") if isinstance(rel.get("local_python"), str) else sys.executable
        ex = state.get("exclude_failed")
        rs = cls(preset, la.transports, _facts_for(rd, state, la.plan),
                 exclude_failed=ex if isinstance(ex, bool) else preset.training.exclude_failed,
                 base_dir=base_dir, local_python=local_python, say=say)
        if type(state.get("restarts")) is int:
            rs.allowed = state["restarts"]
        rs.made = la.attempt - 1  # each relaunch was one more attempt
        attempts = rs._attempts(rd)
        last = attempts[-1] if attempts and isinstance(attempts[-1], dict) else {}
        rs.excluded = [str(x) for x in last.get("excluded") or []]
        return rs

    # ------------------------------------------------------------ state.json
    def _attempts(self, rd: RunDir) -> list[dict]:
        a = rd.read_state().get("attempts")
        return a if isinstance(a, list) else []

    def _record_start(self, la: Launcher, batch: str, resume_from: str | None, started: float) -> None:
        rd = la.run_dir
        attempts = self._attempts(rd)
        attempts.append({"attempt": la.attempt, "started": started, "nodes": [c.label for c in la.plan.nodes],
                         "world_size": la.plan.world_size, "batch": batch, "resume_from": resume_from,
                         "excluded": list(self.excluded)})
        rd.write_state(attempts=attempts, restarts=self.allowed, exclude_failed=self.exclude_failed)
        la.attempt_note = attempt_note(rd.read_state())

    def _record_end(self, la: Launcher, out: RunOutcome, next_step: str) -> None:
        rd = la.run_dir
        attempts = self._attempts(rd)
        if attempts and attempts[-1].get("attempt") == la.attempt:
            failed = out.failed_rank
            attempts[-1].update(ended=time.time(), status=out.status, message=_first_line(out.message),
                                failed_rank=failed,
                                failed_node=None if failed is None else la.plan.nodes[failed].label,
                                cause=out.cause, next=next_step)
            rd.write_state(attempts=attempts)

    # ------------------------------------------------------------ the loop
    def follow(self, la: Launcher, follow_one: FollowOne, max_seconds: float | None = None) -> RunOutcome:
        """Follow `la` (the first attempt, just started) and every relaunch until the run ends."""
        for note in recovery_notes(self.preset, self.exclude_failed):
            self.say(f"note: {note}")
        state = la.run_dir.read_state()
        self._record_start(la, la.plan.batch_formula, self.preset.training.resume_from_checkpoint,
                           state.get("started") or time.time())
        # what a face that takes over (attach, when this one is gone) plans the relaunches with
        la.run_dir.write_state(relaunch={"base_dir": self.base_dir, "local_python": self.local_python})
        driver.record(la.run_dir)
        return self._drive(la, follow_one, max_seconds, None)

    def take_over(self, la: Launcher, out: RunOutcome, follow_one: FollowOne,
                  max_seconds: float | None = None) -> RunOutcome:
        """After attempt `la` ended with `out` and no live face drives the run (this one has claimed the
        role: driver.claim): relaunch as the launching face would have, and follow until the run ends."""
        if out.status == RunState.FAILED and self.made < self.allowed:
            self.say(f"the face that launched this run is gone: attach relaunches it "
                     f"(attempt {la.attempt + 1} of {self.allowed + 1})")
        return self._drive(la, follow_one, max_seconds, out)

    def _drive(self, la: Launcher, follow_one: FollowOne, max_seconds: float | None,
               out: RunOutcome | None) -> RunOutcome:
        """The loop: follow an attempt (unless its outcome `out` is known), relaunch it while restarts remain.
        This face is the run's driver until it returns."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        try:
            while True:
                if out is None:
                    left = None if deadline is None else max(1.0, deadline - time.monotonic())
                    out = follow_one(la, left)
                why = why_not_restart(out.status, out.failed_rank, out.cause, self.made, self.allowed)
                if why is None and la.run_dir.read_state().get("stop_requested"):
                    why = "the run was stopped (qwen-tui attach --stop)"  # its nodes failed because they were stopped
                if why is None and deadline is not None and time.monotonic() >= deadline:
                    why = f"--max-seconds {max_seconds:g} is spent"
                if why is not None:
                    self._record_end(la, out, f"none: {why}")
                    if self.allowed and out.status == RunState.FAILED:
                        self.say(f"not restarted: {why}")
                    return out
                self._record_end(la, out, "restart")
                try:
                    la, out = self._relaunch(la, out), None
                except (RestartRefused, LaunchError, TransportError, OSError) as e:
                    self._refused(la, str(e))
                    return out
                except BaseException:
                    la.run_dir.write_state(status=RunState.FAILED)  # never left restarting for attach to wait on
                    raise
        finally:
            driver.release(la.run_dir)

    def _refused(self, la: Launcher, why: str) -> None:
        self.say(f"not restarted: {why}")
        attempts = self._attempts(la.run_dir)
        if attempts:
            attempts[-1]["next"] = f"none: {why}"
            attempts[-1]["restart_refused"] = why
            la.run_dir.write_state(attempts=attempts, status=RunState.FAILED)

    # ------------------------------------------------------------ one relaunch
    def _relaunch(self, la: Launcher, out: RunOutcome) -> Launcher:
        """Stop what is left of the failed attempt, pick the checkpoint and the nodes, start the next attempt.
        Raises RestartRefused or LaunchError (the failed attempt stays the run's last word)."""
        rd, preset, plan = la.run_dir, self.preset, la.plan
        failed = out.failed_rank
        # a node lost because it cannot be reached is dead too; one whose job another view of the run
        # stopped (attach, after it saw the failure first) only looks lost from here
        dead = {failed} | {r for r, s in out.nodes.items()
                           if s.status == JobState.LOST and (s.error or "").startswith("cannot reach node")}
        # a machine that went away (run/watch/blame.py), or one unreachable past the bound, is left out whatever
        # exclude_failed says: a relaunch on it could not even start, and its old processes cannot be stopped from
        # here (they lose their peers and end on their own)
        lost = {r for r, s in out.nodes.items() if s.status == JobState.LOST and s.cause in (MACHINE_LOST, "UNREACHABLE")}
        excluded = dead | lost if self.exclude_failed else lost
        keep = [c.rank for c in plan.nodes if c.rank not in excluded]
        rd.write_state(status=RunState.RESTARTING)
        self.say(f"node {failed} ({plan.nodes[failed].label}) failed: restart {self.made + 1} of {self.allowed}"
                 + (", without it" if failed in excluded else ", on the same nodes")
                 + (f" (cannot be reached: {', '.join(f'node {r} ({plan.nodes[r].label})' for r in sorted(lost))})"
                    if lost else ""))
        gone = la.stop_all()
        survivors = [r for r in keep if not gone.get(r)]
        if survivors:
            raise RestartRefused("processes of the failed attempt are still running on node(s) "
                                 + ", ".join(f"{r} ({plan.nodes[r].label})" for r in survivors))

        skipped: list[str] = []
        listings = {r: list_checkpoints(self.transports[r], plan.nodes[r], preset.training.output_dir, skipped)
                    for r in keep}
        for line in skipped:
            self.say(f"checkpoint skipped (incomplete): {line}")
        step = common_checkpoint(listings)
        resume = (posixpath.join(preset.training.output_dir, f"checkpoint-{step}") if step is not None
                  else preset.training.resume_from_checkpoint)
        if excluded:
            new, _ = without_nodes(preset, excluded, resuming=resume is not None)
        else:
            new = preset.model_copy(deep=True)
        new.training.resume_from_checkpoint = resume
        transports = {i: self.transports[r] for i, r in enumerate(keep)}
        facts = None
        if self.facts is not None:
            facts = dataclasses.replace(self.facts, nodes={i: self.facts.nodes[r] for i, r in enumerate(keep)
                                                           if r in self.facts.nodes})

        attempt = la.attempt + 1
        next_plan = make_plan(new, run_id=plan.run_id, local_run_dir=str(rd.path), base_dir=self.base_dir,
                              facts=facts, local_python=self.local_python)
        attempt_dirs(next_plan, attempt)
        keep_at = self._metrics_keep_at(rd, la, next_plan, keep)

        if not (rd.path / "preset.first.yaml").exists():
            shutil.copy2(rd.path / "preset.yaml", rd.path / "preset.first.yaml")
        save_preset(new, rd.path / "preset.yaml", mode=0o600)  # what `attach` connects to now
        self.excluded += [plan.nodes[r].label for r in sorted(excluded)]
        started = rd.read_state().get("started")
        nxt = Launcher(next_plan, transports, rd, stop_grace=la.stop_grace, attempt=attempt, metrics_keep_at=keep_at)
        rd.write_state(metrics_keep_at=keep_at)
        nxt.start()
        rd.write_state(started=started, last_started=time.time())  # the run started when its first attempt did
        self.made += 1
        self.preset, self.transports, self.facts = new, transports, facts
        if keep[0] != 0:  # a new master: its metrics file starts empty; the view keeps the loss so far
            nxt.metrics.progress.steps[:0] = la.metrics.progress.steps
            nxt.metrics.progress.events[:0] = la.metrics.progress.events
        where = f"from {resume}" if resume else "from step 0 (no checkpoint every node holds)"
        self.say(f"attempt {attempt}: {len(keep)} node(s), {next_plan.batch_formula}, {where}")
        self._record_start(nxt, next_plan.batch_formula, resume, time.time())
        return nxt

    @staticmethod
    def _metrics_keep_at(rd: RunDir, old: Launcher, new: LaunchPlan, keep: list[int]) -> int:
        """Where the next master's metrics go in the run directory's copy: where the last attempt's went when
        the master is the same node (the worker appends to the same file), else after what is kept already."""
        kept = rd.path / "metrics.jsonl"
        if os.path.realpath(new.metrics_file) == os.path.realpath(kept):
            return 0  # a local master writes the run directory's copy itself
        if keep[0] == 0 and new.metrics_file == old.plan.metrics_file:
            return old.metrics.keep_at
        return kept.stat().st_size if kept.exists() else 0


def _next_of(state: dict, attempt: int) -> tuple[str, int | None] | None:
    """What state.json says follows attempt `attempt`: ("next", K) once attempt K runs, ("none", None) when no
    attempt follows (the driver decided so, or the run allows no restart), None while undecided."""
    cur = state.get("attempt", 1)
    if type(cur) is int and cur > attempt:
        return ("next", cur)  # Launcher.start wrote it: the next attempt runs
    attempts = state.get("attempts") if isinstance(state.get("attempts"), list) else []
    mine = next((a for a in attempts if isinstance(a, dict) and a.get("attempt") == attempt), {})
    nxt = str(mine.get("next") or "")
    if nxt.startswith("none") or (not nxt and not state.get("restarts")):
        return ("none", None)
    return None


def wait_for_next_attempt(rd: RunDir, attempt: int, bound: float = NEXT_ATTEMPT_BOUND,
                          interval: float = 0.5) -> int | None:
    """For `attach`: after attempt `attempt` ended, wait (bounded) for replay to say what comes next. The new
    attempt's number once it runs; None when no attempt follows (or none started within `bound`)."""
    deadline = time.monotonic() + bound
    while True:
        got = _next_of(rd.read_state(), attempt)
        if got is not None:
            return got[1]
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def _claimed(rd: RunDir) -> bool:
    """driver.claim, where a claim lock held past its bound (another face claiming now) counts as a live driver."""
    try:
        return driver.claim(rd)
    except driver.DriverBusy:
        return False


def next_or_take_over(rd: RunDir, attempt: int, bound: float = NEXT_ATTEMPT_BOUND, interval: float = 0.5,
                      cancelled: Callable[[], bool] = lambda: False) -> tuple[str, int | None]:
    """For `attach`, after attempt `attempt` failed: ("next", K) once the run's driver started attempt K;
    ("drive", None) when no live face drives the run: this face has claimed the role (driver.claim) and
    relaunches it (Restarts.from_run_dir, take_over); ("none", None) when no attempt follows, or the live
    driver started none within `bound`; ("cancelled", None) once `cancelled()` (the face is closing)."""
    deadline = time.monotonic() + bound
    while True:
        if cancelled():
            return ("cancelled", None)
        state = rd.read_state()
        got = _next_of(state, attempt)
        if got is not None:
            return got
        if not driver.alive(state.get("driver")) and _claimed(rd):
            return ("drive", None)
        if time.monotonic() >= deadline:
            return ("none", None)
        time.sleep(interval)
