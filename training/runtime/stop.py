"""A stop asked for by SIGTERM (qwen-tui's stop-all, a scheduler's preemption): the worker ends
quietly, with one line in its log, instead of a traceback.

The first SIGTERM raises StopRequested wherever the worker is, so it unwinds at once (a rank
blocked in a collective sees the signal as soon as the call returns, usually with an error
because a peer has gone: that error is part of the same stop, not a failure of its own).
Later signals are ignored while it unwinds.

Under torchrun a stopped worker exits 0: the elastic agent treats any other exit code as a
failure and ends with its ChildFailedError traceback, even though the stop was asked for.
The metrics' end record says "stopped", so nobody reads that 0 as a finished training.
Run without torchrun, it exits 128 + the signal, as a process killed by it would.

Once its workers have exited, each torchrun agent waits at an exit barrier in the rendezvous
store, which node 0's agent hosts. Node 0's agent leaves the barrier, and takes the store with
it, as soon as it checks in last; an agent still between its check-in and its wait then loses
the store and logs "Error waiting on exit barrier" with a traceback. So node 0's first worker,
when stopped, waits (bounded) until every other node's agent has checked in before it exits.
It waits as another program: it replaces itself (exec) with `python -m training.runtime.stop CODE`,
so that the process its agent watches stays while its threads and connections go at once. Waiting
in the worker itself kept the process group's connections open (destroying the group did not close
them there: something still holds the group), and a peer blocked in a collective with it could then not
stop, nor its agent check in, before the bound ran out: the race came back on every late stop.
"""

from __future__ import annotations

import os
import signal
import time

# torch.distributed.elastic's exit barrier: the agents' check-in counter in the rendezvous store
# (agent/server/api.py _TERMINAL_STATE_SYNC_ID + utils/store.py _NUM_MEMBERS, under the run id's prefix)
_EXIT_BARRIER_COUNT = "torchelastic/agent/terminal_state/num_members"
PEERS_BOUND_S = 5.0
# The waiter's environment carries this mark (qwen_tui.nodes.jobs.STOP_MARK reads it): whoever stops the job sees
# a rank that has reached its waiter, which ends on its own once its imports are done (seconds on a loaded
# machine) and it has waited at most PEERS_BOUND_S, and need not kill it, and its agent, for being slow.
STOP_MARK = "QWEN_TUI_STOPPING"


class StopRequested(Exception):
    """The worker was asked to stop (SIGTERM)."""


# Where a stop that lands inside an import looks again (see StopSignal._raise_when_safe).
_IMPORT_FRAMES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
RETRY_S = 0.05


def _in_import(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename in _IMPORT_FRAMES:
            return True
        frame = frame.f_back
    return False


class StopSignal:
    """Installed first thing, unarmed: a signal while the worker still imports torch is only noted (an exception
    raised inside a C extension's import leaves it half-built, and the process may crash later), and `arm()`
    raises it at the first safe point. Armed, the signal raises StopRequested where the worker is, unless that is
    inside an import: the model's classes are imported lazily during set-up, and an exception thrown through a C
    extension's import there aborted the rank (SIGABRT, a torchrun traceback, no stop line). Then the stop waits,
    looking again every RETRY_S (SIGALRM), until the import is done."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.armed = False
        self._deferred = False

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self):
        """Handle SIGTERM from now on; returns the previous handler (for restore)."""
        return signal.signal(signal.SIGTERM, self._handle)

    def arm(self) -> None:
        """From now on a signal raises StopRequested; one that came while unarmed raises here."""
        self.armed = True
        if self.signum is not None:
            raise StopRequested(f"stopped by signal {signal.Signals(self.signum).name}")

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            return  # already unwinding (or waiting for an import to end): a second signal changes nothing
        self.signum = signum
        if self.armed:
            self._raise_when_safe(frame)

    def _raise_when_safe(self, frame) -> None:
        if _in_import(frame):
            if not self._deferred:
                self._deferred = True
                signal.signal(signal.SIGALRM, lambda _s, f: self._raise_when_safe(f))
            signal.setitimer(signal.ITIMER_REAL, RETRY_S)
            return
        if self._deferred:
            self._deferred = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
        raise StopRequested(f"stopped by signal {signal.Signals(self.signum or signal.SIGTERM).name}")

    def await_stop(self, seconds: float) -> bool:
        """Wait up to `seconds` for a SIGTERM (True when one came): a rank whose collective failed because a
        peer had already stopped may see that before its own signal arrives."""
        deadline = time.monotonic() + seconds
        try:
            while self.signum is None and time.monotonic() < deadline:
                time.sleep(0.05)
        except StopRequested:
            pass  # the signal came: what it raised in this wait is the stop itself
        return self.requested

    def exit_code(self) -> int:
        under_torchrun = bool(os.environ.get("TORCHELASTIC_RUN_ID"))
        return 0 if under_torchrun or self.signum is None else 128 + self.signum

    def line(self, step: int | None) -> str:
        where = f"at step {step}" if step is not None else "before training started"
        name = signal.Signals(self.signum).name if self.signum is not None else "a signal"
        return f"stopped by request {where} ({name})"


# How long a rank whose collective lost a peer waits for its own SIGTERM before reporting a failure: a stop
# signals every node at about the same time, but over SSH one node's worker can be gone a moment before another's
# signal arrives. A peer that truly died costs this much more before the failure is reported.
PEER_STOP_WAIT_S = 3.0
_PEER_GONE = ("closed by peer", "reset by peer", "broken pipe", "remote process exited", "communicator was aborted")


def peer_gone(e: BaseException) -> bool:
    """Whether `e` is a collective that failed because another rank went away (gloo's and NCCL's words), in a
    run of several processes."""
    try:
        several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        several = False
    text = str(e).lower()
    return several and any(w in text for w in _PEER_GONE)


def _waits_for_peers(env) -> bool:
    """Whether this is node 0's first worker of a multi-node torchrun job (the one that waits)."""
    try:
        nodes = int(env.get("GROUP_WORLD_SIZE", "1"))
        port = int(env.get("MASTER_PORT", "0"))
    except ValueError:
        return False
    return (env.get("GROUP_RANK") == "0" and env.get("LOCAL_RANK") == "0" and nodes > 1 and bool(port)
            and bool(env.get("TORCHELASTIC_RUN_ID")))


def let_peer_agents_check_out(code: int) -> None:
    """On node 0's first worker of a multi-node torchrun job, stopped: become the waiter (the module docstring)
    and exit with `code` once every other node's agent has checked in to the exit barrier, or after
    PEERS_BOUND_S. Anywhere else, return at once."""
    if not _waits_for_peers(os.environ):
        return
    import logging
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    for fd in os.listdir("/proc/self/fd"):
        if int(fd) > 2:
            try:
                os.set_inheritable(int(fd), False)  # the exec closes it (the process group's sockets among them)
            except OSError:  # the listing's own descriptor, gone by now
                continue
    try:
        # c10d's warnings (a client socket's unresolved host name in a network namespace, as the worker said
        # already) would end the node's log, after the stop line
        os.execve(sys.executable, [sys.executable, "-u", "-m", "training.runtime.stop", str(code)],
                  {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR", STOP_MARK: "1"})
    except OSError as e:  # no exec: wait here, as well as this process can
        print(f"cannot start the stop's waiter ({e}); waiting in the worker", file=sys.stderr)
        wait_for_peer_agents()


def wait_for_peer_agents(bound: float = PEERS_BOUND_S) -> bool:
    """Wait until every other node's agent has checked in to the exit barrier. True when they have (or when
    there is nothing to wait for); False after `bound` seconds or when the store cannot be read. The bound counts
    the import of torch (seconds on a loaded machine, while the other agents check in); the counter is read at
    least once after it."""
    deadline = time.monotonic() + bound
    env = os.environ
    if not _waits_for_peers(env):
        return True
    nodes, port = int(env["GROUP_WORLD_SIZE"]), int(env["MASTER_PORT"])
    from datetime import timedelta

    import torch.distributed as dist

    try:
        store = dist.PrefixStore(env["TORCHELASTIC_RUN_ID"],
                                 dist.TCPStore(env.get("MASTER_ADDR", "127.0.0.1"), port, is_master=False,
                                               timeout=timedelta(seconds=max(1.0, deadline - time.monotonic()))))
        while True:
            if store.add(_EXIT_BARRIER_COUNT, 0) >= nodes - 1:  # add 0: read the counter without changing it
                # an agent counts itself in before it starts waiting on the store: give the last one that moment,
                # or node 0's agent may leave (taking the store) between the two (seen once in CI over SSH)
                time.sleep(min(1.0, max(0.1, deadline - time.monotonic())))
                return True
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
    except (RuntimeError, OSError):  # the store is gone (node 0's agent ended): nothing left to wait for
        return False
    return False


if __name__ == "__main__":  # the waiter: `python -m training.runtime.stop CODE` (let_peer_agents_check_out)
    import sys

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop is under way: a second one changes nothing (as before)
    wait_for_peer_agents()
    sys.exit(int(sys.argv[1]))
