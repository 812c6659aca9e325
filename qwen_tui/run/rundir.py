"""A run directory on the master: everything needed to watch, stop or re-attach a
run after qwen-tui itself has exited.

    $QWEN_TUI_RUNS or $XDG_STATE_HOME/qwen-tui/runs/<run_id>/
      plan.json      the LaunchPlan that was started
      preset.yaml    the preset as launched
      facts.json     what the checks learned (when they ran)
      pids.json      node rank -> pid (= process group) of that node's job, on that node
      starts.json    node rank -> that pid's start time, to recognise it later (nodes/jobs.py)
      state.json     status, times, which node failed and why
      node-<r>.log   local nodes' logs (remote nodes keep theirs on the node)
      metrics.jsonl  the worker's metrics: written there by a local master, copied as read from a remote one
      qwen-tui.log   what qwen-tui logged, when started with -v
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..base.logsetup import log_to_run_dir
from ..plan.launch import LaunchPlan
from .states import RunState

log = logging.getLogger(__name__)


def new_run_id(name: str | None, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name or "run").strip("-")[:40] or "run"
    return f"{stamp}-{slug}-{os.getpid() % 10000:04d}"


def run_slug(run_id: str) -> str | None:
    """The preset name a run id was made from (new_run_id's middle part); None for an id of another shape."""
    m = re.fullmatch(r"\d{8}-\d{6}-(.+)-\d{4}", run_id or "")
    return m.group(1) if m else None


def default_runs_root() -> Path:
    """$QWEN_TUI_RUNS, else $XDG_STATE_HOME/qwen-tui/runs (~/.local/state/...): the same place from any
    directory, so `qwen-tui runs` and `attach last` find a run wherever it was started."""
    if os.environ.get("QWEN_TUI_RUNS"):
        return Path(os.environ["QWEN_TUI_RUNS"]).expanduser().absolute()
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state).absolute() / "qwen-tui" / "runs"


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked_file(path: Path, bound: float) -> Iterator[bool]:
    """An exclusive flock on `path` (created 0600), tried for at most `bound` seconds: yields True when held,
    False when another holder kept it past the bound (the caller decides). Closing the descriptor releases the
    lock, also when this process dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + bound
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    got = False
                    break
                time.sleep(0.02)
        yield got
    finally:
        os.close(fd)


class RunDirError(ValueError):
    """A run directory file is missing, unreadable or not what qwen-tui wrote."""


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def create(cls, root: Path, run_id: str, *, adopt: bool = False) -> "RunDir":
        """A new run directory root/run_id; with `adopt`, the one already there (a SLURM batch job takes over the
        directory its submission made, and after a requeue the one its earlier run filled)."""
        p = Path(root) / run_id
        Path(root).mkdir(parents=True, exist_ok=True)
        p.mkdir(mode=0o700, exist_ok=adopt)  # its files are 0600 (mkstemp, save_preset)
        log_to_run_dir(p)  # with -v: the run keeps its own qwen-tui.log
        return cls(p)

    def write_plan(self, plan: LaunchPlan) -> None:
        write_json_atomic(self.path / "plan.json", plan.to_dict())

    def _read_json(self, name: str, default: Any = None) -> Any:
        f = self.path / name
        try:
            return json.loads(f.read_bytes().decode("utf-8"))
        except FileNotFoundError:
            if default is not None:
                return default
            raise RunDirError(f"{self.path}: not a qwen-tui run directory (no {name})") from None
        except UnicodeDecodeError as e:
            raise RunDirError(f"{f}: not UTF-8 (byte {e.start})") from None
        except ValueError as e:  # JSONDecodeError, and ints too long to convert
            raise RunDirError(f"{f}: not valid JSON: {e}") from None
        except RecursionError:
            raise RunDirError(f"{f}: nested too deeply") from None
        except OSError as e:
            raise RunDirError(f"{f}: cannot read: {e.strerror}") from None

    def read_plan(self) -> LaunchPlan:
        data = self._read_json("plan.json")
        try:
            if not isinstance(data, dict):
                raise TypeError(f"a JSON object is needed, got {type(data).__name__}")
            plan = LaunchPlan.from_dict(data)
            if not plan.nodes:
                raise ValueError("it names no nodes")
            return plan
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise RunDirError(f"{self.path / 'plan.json'}: not a plan qwen-tui wrote: "
                              f"{type(e).__name__}: {e}") from None

    def write_pids(self, pids: dict[int, int], starts: dict[int, int | None] | None = None) -> None:
        write_json_atomic(self.path / "pids.json", {str(k): v for k, v in pids.items()})
        if starts is not None:
            write_json_atomic(self.path / "starts.json", {str(k): v for k, v in starts.items()})

    def read_jobs(self, nnodes: int | None = None) -> dict[int, tuple[int, int | None]]:
        """rank -> (pid, start time or None), checked: ranks of the plan, integer pids."""
        pids, starts = self._read_json("pids.json", {}), self._read_json("starts.json", {})
        out: dict[int, tuple[int, int | None]] = {}
        for name, data in (("pids.json", pids), ("starts.json", starts)):
            if not isinstance(data, dict):
                raise RunDirError(f"{self.path / name}: a JSON object rank -> number is needed, "
                                  f"got {type(data).__name__}")
        for k, v in pids.items():
            where = f"{self.path / 'pids.json'}: rank {k!r}"
            if not (isinstance(k, str) and k.isdigit() and len(k) < 6):
                raise RunDirError(f"{where}: not a node rank")
            if nnodes is not None and int(k) >= nnodes:
                raise RunDirError(f"{where}: the plan has {nnodes} node(s)")
            if type(v) is not int:
                raise RunDirError(f"{where}: the pid must be an integer, got {v!r}"[:300])
            start = starts.get(k)
            if start is not None and type(start) is not int:
                raise RunDirError(f"{self.path / 'starts.json'}: rank {k!r}: not an integer: {start!r}"[:300])
            out[int(k)] = (v, start)
        return out

    def write_state(self, **state: Any) -> None:
        # replay and an attach may both update one run's state: one read-modify-write at a time
        with self._state_lock():
            cur = self.read_state()
            cur.update(state)
            write_json_atomic(self.path / "state.json", cur)

    @contextlib.contextmanager
    def _state_lock(self, bound: float = 5.0) -> Iterator[None]:
        """An exclusive flock on .state.lock, waited for at most `bound` seconds (the holder only rewrites a
        small JSON file); past the bound the update goes ahead unlocked rather than stalling a run."""
        with locked_file(self.path / ".state.lock", bound) as got:
            if not got:
                log.warning("%s: state.json stayed locked for %gs; updating it anyway", self.path, bound)
            yield

    def read_state(self) -> dict[str, Any]:
        data = self._read_json("state.json", {})
        if not isinstance(data, dict):
            raise RunDirError(f"{self.path / 'state.json'}: a JSON object is needed, got {type(data).__name__}")
        return data


def find_running(root: Path) -> RunDir | None:
    """The newest run directory under `root` whose state says running (what the wizard re-attaches to)."""
    if not root.is_dir():
        return None
    for d in sorted(root.iterdir(), reverse=True):
        rd = RunDir(d)
        try:
            if (d / "plan.json").exists() and rd.read_state().get("status") == RunState.RUNNING:
                return rd
        except RunDirError:
            continue  # a corrupt run directory is not one to re-attach to
    return None
