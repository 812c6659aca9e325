"""The runs under a runs root, for `qwen-tui runs` and `qwen-tui attach RUN|last`: what each run directory
says about itself, read from its files only (no node is contacted)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from .rundir import RunDir

TAIL_BYTES = 64 * 1024  # the last step record of metrics.jsonl is near its end


@dataclass
class RunSummary:
    run_id: str
    path: str
    preset: str | None
    state: str
    nodes: list[str]
    started: float | None
    step: int | None
    last_loss: float | None
    attempt: int = 1  # relaunches after a failure make more (run/recovery/restarts.py)
    attempt_note: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def is_run_dir(path: Path) -> bool:
    return (path / "plan.json").is_file()


def _preset_name(path: Path) -> str | None:
    try:
        data = yaml.safe_load((path / "preset.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return data.get("name") if isinstance(data, dict) else None


def _last_step(metrics: Path) -> tuple[int | None, float | None]:
    """(step, loss) of the last step record in a metrics.jsonl, reading only its tail."""
    try:
        with open(metrics, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None, None
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a partial first line of the tail, or one being written
        if isinstance(rec, dict) and isinstance(rec.get("loss"), (int, float)) and "event" not in rec:
            return rec.get("step"), float(rec["loss"])
    return None, None


def summarize(path: Path) -> RunSummary:
    rd = RunDir(path)
    plan = json.loads((path / "plan.json").read_text(encoding="utf-8"))
    state = rd.read_state()
    nodes = [str(n.get("label", "?")) for n in plan.get("nodes", [])]
    master_local = bool(plan.get("nodes")) and plan["nodes"][0].get("local")
    step, loss = _last_step(Path(plan.get("metrics_file", ""))) if master_local else (None, None)
    if step is None:
        step, loss = _last_step(path / "metrics.jsonl")
    started = state.get("started")
    if started is None:
        started = (path / "plan.json").stat().st_mtime
    return RunSummary(run_id=path.name, path=str(path), preset=_preset_name(path),
                      state=str(state.get("status") or "unknown"), nodes=nodes, started=started, step=step,
                      last_loss=loss, attempt=state["attempt"] if type(state.get("attempt")) is int else 1,
                      attempt_note=attempt_note(state))


def list_runs(root: Path) -> list[RunSummary]:
    """Every run directory under root, oldest first."""
    if not root.is_dir():
        return []
    runs = []
    for d in root.iterdir():
        if d.is_dir() and is_run_dir(d):
            try:
                runs.append(summarize(d))
            except (OSError, ValueError) as e:  # one damaged run does not hide the others
                runs.append(RunSummary(d.name, str(d), None, f"unreadable: {e}", [], None, None, None))
    return sorted(runs, key=lambda r: (r.started or 0.0, r.run_id))


class RunNotFound(LookupError):
    pass


def resolve_run(ref: str, root: Path) -> Path:
    """A run directory from what the user typed: a path, `last` (the newest run), a run id, or a unique
    prefix of one. A path that is not here (`runs/<id>`, as the runs are shown) names a run of the runs root by
    its last part. Raises RunNotFound naming the runs root."""
    p = Path(ref).expanduser()
    if (os.sep in ref or ref in (".", "..")) and p.is_dir():
        if not is_run_dir(p):
            raise RunNotFound(f"{p}: not a qwen-tui run directory (no plan.json)")
        return p.absolute()
    if os.sep in ref and p.name and not p.exists():
        ref = p.name
    runs = list_runs(root)
    if ref == "last":
        if not runs:
            raise RunNotFound(f"no runs in {root} (set QWEN_TUI_RUNS or --runs-dir for another place)")
        return Path(runs[-1].path)
    exact = [r for r in runs if r.run_id == ref]
    if exact:
        return Path(exact[0].path)
    if p.is_dir() and is_run_dir(p):  # a run directory named relative to here
        return p.absolute()
    matches = [r for r in runs if r.run_id.startswith(ref)]
    if len(matches) == 1:
        return Path(matches[0].path)
    if matches:
        raise RunNotFound(f"{ref!r} matches {len(matches)} runs in {root}: "
                          + ", ".join(r.run_id for r in matches[:5]))
    raise RunNotFound(f"no run {ref!r} in {root} (`qwen-tui runs` lists them)")


def attempt_note(state: Mapping[str, Any]) -> str | None:
    """One line about the attempts recorded in a run's state.json, for the live view and `qwen-tui runs`;
    None for a run that never restarted."""
    attempts = state.get("attempts")
    if not isinstance(attempts, list) or not attempts or not isinstance(attempts[-1], dict):
        return None
    restarts = state.get("restarts")
    allowed = f" of {int(restarts) + 1}" if isinstance(restarts, int) else ""
    cur = attempts[-1]
    if len(attempts) == 1 and not cur.get("restart_refused"):
        return None
    parts = [f"attempt {len(attempts)}{allowed}"]
    prev = attempts[-2] if len(attempts) > 1 and isinstance(attempts[-2], dict) else {}
    if type(prev.get("failed_rank")) is int:  # why this attempt was needed
        cause = f" ({prev['cause']})" if prev.get("cause") else ""
        parts.append(f"after node {prev['failed_rank']} ({prev.get('failed_node', '?')}) failed{cause}")
    if cur.get("excluded"):
        parts.append("without " + ", ".join(map(str, cur["excluded"])))
    if len(attempts) > 1:
        parts.append(f"resumed from {cur['resume_from']}" if cur.get("resume_from") else "started over from step 0")
    if cur.get("batch"):
        parts.append(f"batch {cur['batch']}")
    if cur.get("restart_refused"):
        parts.append(f"not restarted: {cur['restart_refused']}")
    return "; ".join(parts)
