"""One long-lived command server on a node (remote/agent.py), reached through a local process's pipes.

The process is whatever puts the agent on the node: `srun --overlap ... python3 -u -c AGENT` for a SLURM node.
Requests and answers are JSON lines tagged with an id, so many threads (the monitor's reads, the checks, a
stream) share the one pipe, as they share one SSH connection. Every call has a bound; when the process ends
(the job ended, the node went away) every waiting call raises TransportError at once, and the next call
starts the process anew.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..programs import program
from ..transport.protocol import SessionEnded, TransportError, check_stream_quiet

AGENT = program("agent.py")
# srun's words when the job that held the node is over (its step cannot run, or was ended with the job)
_JOB_OVER = re.compile(r"has expired|has been cancelled|has been revoked|already completing or completed|"
                       r"Invalid job id|Job/step already completing|Job .* does not exist", re.I)
_GONE = {"error": "the node's command server went away"}


class AgentLink:
    """`argv` starts the agent (it ends with the Python to run it, which gets `-u -c AGENT`); `env` is the
    environment of that process (what srun passes on to the node)."""

    def __init__(self, label: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 start_bound: float = 60.0):
        self.label = label
        self.argv = [*argv, "-u", "-c", AGENT]
        self.env = dict(env) if env is not None else None
        self.start_bound = start_bound
        self.hello: dict[str, Any] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._waiting: dict[int, queue.Queue] = {}
        self._errors: deque[str] = deque(maxlen=20)  # the launcher's own words (srun: error: ...)
        self._errors_reader: threading.Thread | None = None
        # pids whose output has ended: gone, even while the kernel has not reaped them yet (a write to one can
        # still succeed for a moment, and would wait for an answer that never comes)
        self._ended: set[int] = set()

    # ------------------------------------------------------------ the process
    def _ensure(self) -> subprocess.Popen:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None and self._proc.pid not in self._ended:
                return self._proc
            self._errors.clear()
            try:
                p = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=self.env, start_new_session=True)
            except OSError as e:
                raise TransportError(f"{self.label}: cannot start {self.argv[0]}: {e}") from None
            self._proc = p
            errors = threading.Thread(target=self._read_errors, args=(p,), daemon=True)
            errors.start()
            self._errors_reader = errors
            threading.Thread(target=self._read, args=(p, errors), daemon=True, name=f"agent-{self.label}").start()
        try:
            self.hello = self._call(p, {"op": "hello"}, self.start_bound)
        except TransportError:
            self._end(p)
            raise
        return p

    def _read(self, p: subprocess.Popen, errors: threading.Thread) -> None:
        assert p.stdout is not None
        for raw in p.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                self._errors.append(raw.decode(errors="replace").rstrip())  # a stray line: kept for the error text
                continue
            q = self._waiting.get(msg.get("id"))
            if q is not None:
                q.put(msg)
        self._ended.add(p.pid)
        errors.join(2.0)  # its last words first: they say why it ended (the job is over, say)
        for q in list(self._waiting.values()):  # the process is gone: nobody waits in vain
            q.put(_GONE)

    def _read_errors(self, p: subprocess.Popen) -> None:
        assert p.stderr is not None
        for raw in p.stderr:
            self._errors.append(raw.decode(errors="replace").rstrip())

    def why(self) -> str:
        """What the process said on stderr, its last lines (why it could not start or ended)."""
        said = [ln for ln in self._errors if ln]
        return "; ".join(said[-3:])

    def _gone(self, what: str, ended: bool = True) -> TransportError:
        """The error for a server that went away (ended) or stays silent: SessionEnded when its launcher says the
        job is over."""
        reader = self._errors_reader
        if ended and reader is not None:
            reader.join(2.0)  # its last words (the job is over, say) may still be in the pipe: stderr ends with it
        why = self.why()
        text = f"{self.label}: {what}" + (f" ({why})" if why else "")
        return SessionEnded(text) if _JOB_OVER.search(why) else TransportError(text)

    def _end(self, p: subprocess.Popen) -> None:
        for pipe in (p.stdin,):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass  # already closed by the process's end
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # ended between the wait and the kill
            p.wait(timeout=5)

    def close(self) -> None:
        """End the agent (its stdin closes: it kills what it still runs and exits)."""
        with self._lock:
            p, self._proc = self._proc, None
        if p is not None:
            self._end(p)

    # ------------------------------------------------------------ calls
    def _send(self, p: subprocess.Popen, msg: dict) -> None:
        line = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        try:
            with self._send_lock:
                assert p.stdin is not None
                p.stdin.write(line)
                p.stdin.flush()
        except (OSError, ValueError):
            raise self._gone("the node's command server went away") from None

    def _call(self, p: subprocess.Popen, msg: dict, bound: float) -> dict:
        rid = next(self._ids)
        q: queue.Queue = queue.Queue()
        self._waiting[rid] = q
        try:
            if p.pid in self._ended:
                raise self._gone("the node's command server went away")
            self._send(p, {**msg, "id": rid})
            deadline = time.monotonic() + bound
            while True:
                try:
                    ans = q.get(timeout=min(0.5, max(0.01, deadline - time.monotonic())))
                    break
                except queue.Empty:
                    # its output has ended: every answer it gave is in its queue by now, so none is coming
                    if p.pid in self._ended and q.empty():
                        raise self._gone("the node's command server went away") from None
                    if time.monotonic() >= deadline:
                        raise self._gone(f"no answer within {bound:g}s", ended=False) from None
        finally:
            self._waiting.pop(rid, None)
        if ans is _GONE or ans.get("error") == _GONE["error"]:
            raise self._gone("the node's command server went away")
        if "error" in ans:
            raise TransportError(f"{self.label}: {ans['error']}")
        return ans

    def call(self, op: str, bound: float, **fields: Any) -> dict:
        return self._call(self._ensure(), {"op": op, **fields}, bound)

    def run(self, argv: Sequence[str], *, timeout: float, input: bytes | None = None,
            env: Mapping[str, str] | None = None, cwd: str | None = None) -> tuple[int, bytes, bytes]:
        ans = self.call("run", timeout + 10, argv=list(argv), env=dict(env) if env else None, cwd=cwd,
                        input=base64.b64encode(input).decode() if input else None, timeout=timeout)
        return int(ans["rc"]), base64.b64decode(ans["out"]), base64.b64decode(ans["err"])

    def stream(self, argv: Sequence[str], *, stop: threading.Event, timeout_first_line: float,
               idle_timeout: float | None, poll: float) -> Iterator[str]:
        p = self._ensure()
        rid = next(self._ids)
        q: queue.Queue = queue.Queue()
        self._waiting[rid] = q
        started = last = time.monotonic()
        got_line = False
        try:
            self._send(p, {"op": "stream", "argv": list(argv), "id": rid})
            while not stop.is_set():
                try:
                    msg = q.get(timeout=poll)
                except queue.Empty:
                    if p.pid in self._ended and q.empty():
                        raise self._gone("the node's command server went away during a stream") from None
                    check_stream_quiet(self.label, argv, time.monotonic(), started, last, got_line,
                                       timeout_first_line, idle_timeout)
                    continue
                if msg is _GONE:
                    raise self._gone("the node's command server went away during a stream")
                if "line" in msg:
                    last, got_line = time.monotonic(), True
                    yield msg["line"]
                elif "end" in msg or "error" in msg:
                    return
        finally:
            self._waiting.pop(rid, None)
            if p.poll() is None:
                try:
                    self._send(p, {"op": "cancel", "target": rid, "id": 0})
                except TransportError:
                    pass  # the agent is gone, and the stream's command with it
