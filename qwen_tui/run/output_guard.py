"""Before `replay`/`demo` launch: does node 0's output directory already hold another run's checkpoints or final
model? The new run would write next to and over them (and `resume_from_checkpoint: auto` would pick them up), so
the commands refuse unless told (`--overwrite-output`), or say what a resume will continue from. The wizard asks
the same question in a dialog (ui/launch_guard.py)."""

from __future__ import annotations

import json
import posixpath
import re

from ..nodes.transport.protocol import Transport, TransportError
from ..plan.launch import LaunchPlan

LOOK_TIMEOUT_S = 10.0
_CKPT = re.compile(r"^checkpoint-(\d+)$")
# what a finished run leaves in output_dir (a full model, an adapter, the merged model)
MODEL_FILES = frozenset({"config.json", "adapter_config.json", "model.safetensors", "model.safetensors.index.json",
                         "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin", "merged"})


def output_dir(plan: LaunchPlan) -> str:
    """training.output_dir as node 0's worker resolves it."""
    out = plan.output_dir
    return out if posixpath.isabs(out) else posixpath.normpath(posixpath.join(plan.nodes[0].workdir, out))


def run_files(entries: list[str]) -> list[str]:
    """The entries that a run left: its checkpoints (by step) and its final model's files."""
    ckpts = sorted((e for e in entries if _CKPT.match(e)), key=lambda e: int(_CKPT.match(e).group(1)))
    return ckpts + sorted(e for e in entries if e in MODEL_FILES)


def look(t: Transport, out: str) -> list[str]:
    """The entries of `out` on the node ([] when it does not exist). Raises TransportError."""
    res = t.run(["ls", "-A", "--", out], timeout=LOOK_TIMEOUT_S)
    return res.stdout.split() if res.ok else []


def checkpoint_state(t: Transport, ckpt: str) -> dict:
    """A checkpoint's finetune_state.json ({} when it cannot be read)."""
    for name in ("finetune_state.json", "trainer_state.json"):
        try:
            res = t.run(["cat", "--", posixpath.join(ckpt, name)], timeout=LOOK_TIMEOUT_S)
        except TransportError:
            return {}
        if res.ok:
            try:
                return json.loads(res.stdout)
            except json.JSONDecodeError:
                return {}
    return {}


def guard(plan: LaunchPlan, resume: str | None, t: Transport,
          own: str | None = None) -> tuple[str | None, str | None]:
    """(refusal, note): a refusal when the output directory holds another run's files and nothing says to use
    them; a note saying what `resume_from_checkpoint` will continue from. Both None when the directory is new.
    `own`: a preset name whose earlier runs' output this run replaces (each checkpoint there must say it was saved
    by a run of that name; a final model alone proves nothing and is refused as before)."""
    out = output_dir(plan)
    try:
        found = run_files(look(t, out))
    except TransportError as e:
        return None, f"could not look at {out} on node 0 ({e}): launching without that check"
    ckpts = [e for e in found if _CKPT.match(e)]
    if resume:
        if resume != "auto":
            return None, f"resuming from {resume} (training.resume_from_checkpoint)"
        if ckpts:
            newest = posixpath.join(out, ckpts[-1])
            st = checkpoint_state(t, newest)
            by = f", saved by run {st['run_id']}" if st.get("run_id") else ""
            return None, (f"resume_from_checkpoint: auto resumes from {newest} (step {st.get('step', '?')}{by}); "
                          f"set another training.output_dir to start afresh")
    if not found:
        return None, None
    if own and ckpts:
        from .rundir import run_slug

        savers = {checkpoint_state(t, posixpath.join(out, c)).get("run_id") for c in ckpts}
        if all(isinstance(s, str) and run_slug(s) == own for s in savers):
            return None, f"replacing the output of the earlier {own} run in {out} ({', '.join(sorted(savers))})"
    shown = ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
    what = "checkpoints" if ckpts else "final model"
    return (f"not launched: {out} on node 0 already holds another run's {what} ({shown}); the new run would write "
            f"its checkpoints and model next to and over them"), None


FIX = ("set another training.output_dir, resume from them (training.resume_from_checkpoint: auto), or launch "
       "into it anyway: --overwrite-output (their files are replaced only where the new run writes the "
       "same names; another run's checkpoints are never rotated away)")
