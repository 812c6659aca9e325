"""Run directories as the launcher writes them, without training (for the commands that list and read runs)."""

from __future__ import annotations

import json
from pathlib import Path


def fake_run(root: Path, run_id: str, started: float, status: str = "ok", losses=()) -> Path:
    """A run directory as the launcher writes it (plan, preset, state, metrics), without training."""
    d = root / run_id
    d.mkdir(parents=True)
    plan = {"run_id": run_id, "nodes": [{"label": "gpu-1", "local": True}, {"label": "gpu-2", "local": False}],
            "metrics_file": str(d / "metrics.jsonl")}
    (d / "plan.json").write_text(json.dumps(plan))
    (d / "preset.yaml").write_text(f"version: 1\nname: {run_id.split('-')[0]}\n")
    (d / "state.json").write_text(json.dumps({"status": status, "started": started}))
    recs = [{"event": "start"}] + [{"step": i + 1, "loss": x} for i, x in enumerate(losses)] + [{"event": "end"}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d
