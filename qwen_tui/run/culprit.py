"""Which node a failed attempt blames, from every failed node's log, its kernel's log and who still answers.

A node with a cause of its own (lost, killed, an error a signature knows) beats the nodes that only lost a peer (a
reset, a timeout); when every failed node only lost a peer, a node that stopped answering meanwhile is the machine
lost (run/watch/blame.py), and while every other node still runs and answers the verdict waits a few seconds
(CAUSE_GRACE_S) for the cause to show itself. Replay and an attach that follow one run agree on the node through
state.json. The launcher asks once a node of its attempt has failed, and ends the attempt on the answer.
"""

from __future__ import annotations

import re
import time
from typing import Any, Protocol

from .states import JobState
from .watch.blame import CAUSE_GRACE_S
from .watch.monitor import Attempt, RunMonitor

# torchrun's failure summary for a rank that died of SIGKILL (the OOM killer, or by hand)
_RANK_SIGKILLED = re.compile(r"exitcode\s*:\s*-9\b")


class Failing(Attempt, Protocol):
    """What the search reads of the launcher whose attempt failed (run/launcher.py)."""

    monitor: RunMonitor

    def log_tail(self, rank: int, lines: int = 20, max_bytes: int = 64 * 1024) -> list[str]: ...


class Culprit:
    """The node to blame for a launcher's failed attempt. What it keeps between looks: the log tails of nodes whose
    jobs have ended, when only survivors' errors were first seen, and each node's kernel faults (read once)."""

    def __init__(self, la: Failing) -> None:
        self.la = la
        self._tails: dict[int, list[str]] = {}  # rank -> the log tail of a node whose job has ended (read once)
        self._survivors_since: float | None = None  # when only survivors' errors were first seen
        self._kernel: dict[int, object] = {}  # rank -> the hardware fault its kernel log reports (read once)

    def find(self, bad: list[Any], *, grace: bool = True):
        """The failed node to blame: a lost node or one whose log shows a cause of its own
        beats nodes that only saw a peer go away (connection reset, timeouts). When every failed node only saw
        a peer go away, a node that stopped answering meanwhile is the cause (run/watch/blame.py), and while every
        other node still runs and answers, None for a few seconds: the cause has not shown itself yet."""
        from ..cluster.failures import CONSEQUENTIAL, diagnose, without_agent_report

        found = []
        for st in bad:
            raw = self._tails.get(st.rank)
            if raw is None:
                try:
                    raw = self.la.log_tail(st.rank, lines=80)
                except Exception:  # an unreachable node has no readable log; it is still named
                    raw = []
                if st.status == JobState.FAILED and raw and not self.la.monitor.health.unreachable(st.rank):
                    self._tails[st.rank] = raw  # its job has ended: its log no longer changes
            d = diagnose("\n".join(raw[-40:]), python=self.la.plan.nodes[st.rank].argv[0])
            if st.cause == "MACHINE_LOST" and st.rank in self.la.monitor.lost_evidence:
                from .watch.blame import machine_lost

                d = machine_lost(self.la.monitor.lost_evidence[st.rank])
            elif (d is None or d.code in CONSEQUENTIAL) and self._cuda and \
                    not self.la.monitor.health.unreachable(st.rank):
                d = self._kernel_fault(st.rank) or d
            # an agent that died by a signal (exit code above 128), or whose rank torchrun saw die of SIGKILL
            # (before anything was stopped: the tail is read first), was killed, not told of a peer's failure
            killed = (st.rc is not None and st.rc > 128) or any(_RANK_SIGKILLED.search(ln) for ln in raw[-40:])
            tail = without_agent_report(raw)[-40:]  # what the user reads: the worker's words, not torchrun's report
            # 0: a cause of its own (lost, killed, a known error); 1: an error no signature knows (most likely its
            # own too); 2: only what a peer's loss causes (a reset, a timeout)
            if st.status == JobState.LOST or killed or (d is not None and d.code not in CONSEQUENTIAL):
                rank_of_cause = 0
            else:
                rank_of_cause = 1 if d is None else 2
            found.append((rank_of_cause, st.rank, st, d, tail))
        found.sort(key=lambda x: (x[0], x[1]))
        rank_of_cause, _, st, d, tail = found[0]
        if rank_of_cause == 2 and grace:
            lost = self._machine_lost([(x[2], x[3]) for x in found])
            if lost is not None:
                return lost
            if self._survivors_since is None:
                self._survivors_since = time.monotonic()
            others = [s for s in self.la.nodes.values() if s.status == JobState.RUNNING]
            if others and time.monotonic() - self._survivors_since < CAUSE_GRACE_S:
                return None
        return st, d, tail

    def agree(self, first: Any, diag, tail):
        """Replay and an attach may follow one run: the first to see a failure names the node in
        state.json before it stops the others, whose jobs then look killed from the second view.
        Both then blame the same node (what a relaunch without it leaves out)."""
        from .rundir import RunDirError

        try:
            seen = self.la.run_dir.read_state().get("failing")
        except RunDirError:
            seen = None
        if isinstance(seen, dict) and seen.get("attempt") == self.la.attempt:
            rank = seen.get("rank")
            if type(rank) is int and rank in self.la.nodes and rank != first.rank:
                return self.find([self.la.nodes[rank]], grace=False)
            return first, diag, tail
        self.la.run_dir.write_state(failing={"attempt": self.la.attempt, "rank": first.rank})
        return first, diag, tail

    @property
    def _cuda(self) -> bool:
        return any("--use_cpu" not in c.argv for c in self.la.plan.nodes)

    def _kernel_fault(self, rank: int):
        """A hardware fault the node's kernel log reports (a GPU's Xid, a fallen-off GPU: the driver writes them
        there, not to the run's log), as a Diagnosis; read once a node, None where there is none."""
        from ..cluster.failures import Diagnosis
        from .watch.evidence import node_kernel_faults

        if rank not in self._kernel:
            state = self.la.run_dir.read_state()
            began = state.get("last_started") or state.get("started")
            found = node_kernel_faults(self.la.transports[rank], began, time.time()) \
                if isinstance(began, (int, float)) else []
            self._kernel[rank] = Diagnosis(found[0][0], found[0][1], found[0][2], "kernel log: " + found[0][3]) \
                if found else None
        return self._kernel[rank]

    def _machine_lost(self, survivors):
        """A running node that stopped answering while the failed ones saw only a peer go away: LOST, blamed,
        with the evidence (run/watch/blame.py). None when every running node still answers."""
        from .watch.blame import MACHINE_LOST, Survivor, evidence_line, machine_lost, pick_lost

        h = self.la.monitor.health
        away = {s.rank: h.seconds_unreachable(s.rank) for s in self.la.nodes.values()
                if s.status == JobState.RUNNING and h.unreachable(s.rank)}
        node = pick_lost(away)
        if node is None:
            return None
        said = [Survivor(st.rank, st.label, d.line) for st, d in survivors if d is not None]
        text = evidence_line(node, self.la.nodes[node].label, h.nodes[node].last_error, away[node], said,
                             self._addresses())
        st = self.la.nodes[node]
        st.status, st.cause = JobState.LOST, MACHINE_LOST
        st.error = "stopped answering while the other nodes failed with communication errors"
        return st, machine_lost(text), []

    def _addresses(self) -> dict[int, list[str]]:
        """Each node's addresses as far as the plan and the checks know them (facts.json), for matching the
        peers that survivors' logs name."""
        import json

        out = {c.rank: [c.host] for c in self.la.plan.nodes}
        try:
            facts = json.loads((self.la.run_dir.path / "facts.json").read_text())
        except (OSError, ValueError):
            return out
        nodes = facts.get("nodes") if isinstance(facts, dict) else None
        # facts.json holds the first launch's node ranks; a relaunch without a node renumbers the rest
        attempts = self.la.run_dir.read_state().get("attempts")
        first = attempts[0].get("nodes") if isinstance(attempts, list) and attempts and \
            isinstance(attempts[0], dict) else None
        labels = {c.label: c.rank for c in self.la.plan.nodes}
        for key, nf in (nodes or {}).items() if isinstance(nodes, dict) else []:
            if not isinstance(nf, dict) or not str(key).isdigit():
                continue
            k = int(key)
            rank = labels.get(first[k]) if isinstance(first, list) and k < len(first) else k
            addrs = [a for v in (nf.get("addresses") or {}).values() if isinstance(v, list) for a in v]
            if rank in out:
                out[rank] += [str(a).split("/")[0] for a in addrs]
        return out
