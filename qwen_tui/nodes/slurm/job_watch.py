"""What SLURM says of a running job and its nodes, for the launcher that follows the job's steps: SLURM's word
wins over what a read of a node guesses. A node SLURM has set DOWN (or failed, or taken out of the job) is lost,
and named, at once, rather than after the unreachable bound; a job that SLURM ended (CANCELLED, TIMEOUT,
NODE_FAIL, PREEMPTED, OUT_OF_MEMORY...) ends the run with that state as its outcome; a job SLURM requeued is
between two runs of its batch script.

The controller is asked from a thread of its own every few seconds, so that a slow controller never holds up
the view; `look()` returns the latest verdict without waiting.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from . import queries

log = logging.getLogger(__name__)

EVERY_S = 3.0
# What each ended JobState means for the user, in a few words.
ENDED_WORDS = {
    "COMPLETED": "the job completed",
    "CANCELLED": "the job was cancelled (scancel, or an administrator)",
    "FAILED": "the job's batch script failed",
    "TIMEOUT": "the job reached its time limit (scheduler.time)",
    "NODE_FAIL": "a node of the job failed",
    "PREEMPTED": "the job was preempted by a job of higher priority",
    "OUT_OF_MEMORY": "a process of the job ran out of memory (the node's cgroup limit)",
    "BOOT_FAIL": "a node of the job failed to boot",
    "DEADLINE": "the job reached its deadline",
}


@dataclass(frozen=True)
class SlurmVerdict:
    kind: str  # "ended", "requeued" or "node"
    state: str  # the job's JobState, or the node's State for "node"
    text: str
    rank: int | None = None  # the node, for "node"


class JobWatch:
    """Watches job `job_id` whose node `rank` is `hosts[rank]`. The job's restart count at the first look is the
    baseline: a higher one later means SLURM requeued it."""

    def __init__(self, job_id: str, hosts: list[str], *, every: float = EVERY_S):
        self.job_id = job_id
        self.hosts = list(hosts)
        self.every = every
        self.info: queries.JobInfo | None = None
        self._verdict: SlurmVerdict | None = None
        self._restarts: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True, name=f"slurm-job-{self.job_id}")
            self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def cancels_on_stop(self) -> bool:
        """Whether a user's stop from here is a cancel of the whole job: a batch job, followed from outside it (the
        login node). Its own qwen-tui inside the job, or a face inside an salloc, stops the steps instead."""
        if os.environ.get("SLURM_JOB_ID") == self.job_id:
            return False
        info = self.info or queries.job(self.job_id)
        return info is not None and info.raw.get("BatchFlag") == "1"

    def cancel(self, bound: float) -> queries.JobInfo | None:
        """scancel the job and wait (at most `bound` s) until SLURM says it ended; its last record."""
        import time

        queries.cancel(self.job_id)
        deadline = time.monotonic() + bound
        info = queries.job(self.job_id)
        while info is not None and not info.ended and time.monotonic() < deadline:
            time.sleep(0.5)
            info = queries.job(self.job_id)
        return info

    def look(self) -> SlurmVerdict | None:
        self.start()
        with self._lock:
            return self._verdict

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                v = self.judge()
            except queries.SlurmError as e:  # the controller did not answer this time: the next look asks again
                log.warning("asking SLURM about job %s: %s", self.job_id, e)
                v = None
            if v is not None:
                with self._lock:
                    self._verdict = v
                return  # a verdict is final for this attempt
            self._stop.wait(self.every)

    def judge(self) -> SlurmVerdict | None:
        """One look at the job and its nodes (blocking): a verdict, or None while all is well."""
        info = queries.job(self.job_id)
        self.info = info
        if info is None:
            return SlurmVerdict("ended", "UNKNOWN", f"SLURM no longer knows job {self.job_id}")
        if self._restarts is None:
            self._restarts = info.restarts
        if info.state in queries.ENDED:
            why = ENDED_WORDS.get(info.state, info.state.lower())
            extra = "; ".join(x for x in (f"reason {info.why_pending}" if info.why_pending else "",
                                          f"exit code {info.exit_code}" if info.exit_code not in ("", "0:0") else "")
                              if x)
            return SlurmVerdict("ended", info.state, f"SLURM: job {self.job_id} {info.state}: {why}"
                                + (f" ({extra})" if extra else ""))
        if info.state != "RUNNING" or info.restarts > self._restarts:
            return SlurmVerdict("requeued", info.state,
                                f"SLURM requeued job {self.job_id} ({info.state}, restart {info.restarts}"
                                + (f", {info.why_pending}" if info.why_pending else "")
                                + "): it resumes from its last checkpoint when it runs again")
        states = queries.node_states(self.hosts)
        for rank, host in enumerate(self.hosts):
            state, reason = states.get(host, ("UNKNOWN", ""))
            gone_from_job = bool(info.nodes) and host not in info.nodes
            if queries.node_gone(state) or gone_from_job:
                what = f"is {state}" + (f" ({reason})" if reason and reason != "none" else "")
                if gone_from_job and not queries.node_gone(state):
                    what = "was taken out of the job"
                return SlurmVerdict("node", state, f"SLURM says node {rank} ({host}) {what}", rank)
        return None
