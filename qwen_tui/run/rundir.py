"""A run directory on the master: everything needed to watch, stop or re-attach a
run after qwen-tui itself has exited.

    $QWEN_TUI_RUNS or $XDG_STATE_HOME/qwen-tui/runs/<run_id>/
      plan.json      the LaunchPlan that was started
      preset.yaml    the preset as launched
      facts.json     what the checks learned (when they ran)
      pids.json      node rank -> pid (= process group) of that node's job, on that node
      state.json     status, times, which node failed and why
      node-<r>.log   local nodes' logs (remote nodes keep theirs on the node)
      metrics.jsonl  the worker's metrics, when the master node is local
      qwen-tui.log   what qwen-tui logged, when started with -v
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from ..logsetup import log_to_run_dir
from ..plan import LaunchPlan


def new_run_id(name: Optional[str], now: Optional[float] = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name or "run").strip("-")[:40] or "run"
    return f"{stamp}-{slug}-{os.getpid() % 10000:04d}"


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


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def create(cls, root: Path, run_id: str) -> "RunDir":
        p = Path(root) / run_id
        p.mkdir(parents=True, exist_ok=False)
        log_to_run_dir(p)  # with -v: the run keeps its own qwen-tui.log
        return cls(p)

    def write_plan(self, plan: LaunchPlan) -> None:
        write_json_atomic(self.path / "plan.json", plan.to_dict())

    def read_plan(self) -> LaunchPlan:
        try:
            return LaunchPlan.from_dict(json.loads((self.path / "plan.json").read_text()))
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path}: not a qwen-tui run directory (no plan.json)") from None

    def write_pids(self, pids: dict[int, int]) -> None:
        write_json_atomic(self.path / "pids.json", {str(k): v for k, v in pids.items()})

    def read_pids(self) -> dict[int, int]:
        try:
            return {int(k): int(v) for k, v in json.loads((self.path / "pids.json").read_text()).items()}
        except FileNotFoundError:
            return {}

    def write_state(self, **state: Any) -> None:
        cur = self.read_state()
        cur.update(state)
        write_json_atomic(self.path / "state.json", cur)

    def read_state(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / "state.json").read_text())
        except FileNotFoundError:
            return {}
