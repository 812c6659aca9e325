"""Step 5, Review: the exact command and environment of every node (the same
LaunchPlan `replay` and the exports render), the preset as YAML; save, export
SLURM/PBS/shell scripts, launch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static, TabbedContent, TabPane

from ...base.atomic import write_text_atomic
from ...base.levels import Level
from ...base.redact import shown_env
from ...plan.launch import LaunchPlan, make_plan
from ...preset.files import dump_preset
from ...wizard.state import BAD, OK, STEPS, TITLES, TODO, WARN, NodeStatus, ProbeState, SshState, step_of
from ..modals import Form, Notice
from ..styles import ERROR, GOOD, NOTE_STRONG, WARNING, tone
from .base import StepScreen

PREVIEW_RUN_ID = "<run-id>"  # the real id is made at launch; a fixed one keeps the view stable


def preview_plan(state, base_dir: str, local_python: str | None = None) -> LaunchPlan:
    """The plan launch will make (local_python: what local nodes without a python of their own run)."""
    return make_plan(state.preset, run_id=PREVIEW_RUN_ID, local_run_dir=f"runs/{PREVIEW_RUN_ID}",
                     base_dir=base_dir, facts=state.facts, local_python=local_python)


def plan_text(plan: LaunchPlan) -> Text:
    t = Text()
    t.append(f"{plan.nnodes} nodes, world size {plan.world_size}, backend {plan.backend}, "
             f"master {plan.master_addr}:{plan.master_port}\n", style="bold")
    t.append(f"effective batch size: {plan.batch_formula}\n\n")
    for c in plan.nodes:
        t.append(f"── node {c.rank}: {c.label}{' (this machine)' if c.local else ''} ──\n", style=tone(NOTE_STRONG))
        for k, v in shown_env(c.env).items():  # secrets as ***, control characters escaped
            t.append(f"  {k}", style=tone(GOOD))
            t.append(f"={v}\n")
        t.append(f"  {c.shell_line()}\n\n")
    return t


_TODO = {"nodes": "not probed yet (p there)", "ssh": "not connected yet (c there)",
         "network": "not checked yet (r there)", "training": "not checked yet"}


def checks_text(st) -> Text:
    """One line per step before Review, from the same state the stepper shows: no "no errors"
    while a check failed, no ✔ before a check ran."""
    t = Text()
    errs = [a for a in st.advice if a.level == Level.ERROR]
    warns = [a for a in st.advice if a.level == Level.WARNING]
    seen: set[str] = set()
    for n, step in enumerate(STEPS[:4], start=1):
        status = st.step_status(step)
        title = f"{TITLES[step]} (F{n})"
        seen.add(status)
        if status == OK:
            continue
        if status == TODO:
            t.append(f"· {title}: {_TODO[step]}\n", style="dim")
            continue
        mark, style = ("✘", tone(ERROR)) if status == BAD else ("!", tone(WARNING))
        why = ""
        if step == "training":
            bad = errs if status == BAD else warns
            why = "; ".join(a.code for a in bad) or ("GPU unknown: fit not checked" if st.gpu_unknown else "")
        elif step in ("nodes", "ssh"):
            def failed_here(ns: NodeStatus, step: str = step) -> bool:
                return ns.probe == ProbeState.ERROR if step == "nodes" else SshState(ns.ssh).failed

            failed = [f"node {i} ({st.preset.slots[i].label})" for i in range(len(st.preset.cluster.nodes))
                      if failed_here(st.node(i))]
            codes = sorted({f.code for f in st.findings if (f.level == Level.ERROR) == (status == BAD)})
            why = ("cannot reach " + ", ".join(failed)) if failed else "; ".join(codes) if step == "nodes" else ""
        elif step == "network":
            codes = sorted({f.code for f in st.net_findings if (f.level == Level.ERROR) == (status == BAD)})
            slow = [f"node {i} at {lk.bandwidth_gbps:.1f} Gbit/s" for i, lk in sorted(st.facts.links.items())
                    if lk.bandwidth_gbps is not None and lk.bandwidth_gbps < 10]
            why = "; ".join(codes + (["under 10 Gbit/s: " + ", ".join(slow)] if slow and status == WARN else []))
        if any(step_of(p) == step for p in st.field_errors):
            why = (why + "; " if why else "") + "a value was not accepted"
        t.append(f"{mark} {title}: {why or 'see the step'}\n", style=style)
    if errs and st.step_status("training") != BAD:
        t.append(f"✘ {len(errs)} error(s): " + "; ".join(a.code for a in errs) + "\n", style=tone(ERROR))
    if not seen & {BAD, TODO}:
        t.append("✔ every check ran and passed" + (" (warnings above)" if WARN in seen else "") + "\n",
                 style=tone(GOOD))
    return t


class ReviewScreen(StepScreen):
    STEP = "review"
    BINDINGS = [Binding("l", "launch", "Launch"), Binding("x", "export", "Export")]

    def body(self) -> ComposeResult:
        yield Static(id="review-summary")
        with TabbedContent(id="review-tabs"):
            with TabPane("Commands per node", id="tab-commands"):
                with VerticalScroll():
                    yield Static(id="commands")
            with TabPane("Preset YAML", id="tab-yaml"):
                with VerticalScroll():
                    yield Static(id="yaml")

    def refresh_state(self) -> None:
        st = self.state
        self.query_one("#commands", Static).update(plan_text(preview_plan(st, self.wizard.base_dir,
                                                                          self.wizard.local_python)))
        shown_preset = st.preset.model_copy(deep=True)  # what is shown: secrets in network.env as ***
        shown_preset.network.env = shown_env(st.preset.network.env)
        self.query_one("#yaml", Static).update(Syntax(dump_preset(shown_preset), "yaml", theme="ansi_dark",
                                                      background_color="default"))
        s = Text()
        where = str(st.path) if st.path else "not saved yet"
        s.append(f"preset: {where}{' (unsaved changes)' if st.dirty else ''}\n", style=tone(WARNING) if st.dirty else "")
        s.append_text(checks_text(st))
        s.append("l launches  ·  x exports scripts  ·  ctrl+s saves the preset", style="dim")
        self.query_one("#review-summary", Static).update(s)

    # ---------------------------------------------------------------- export
    def action_export(self) -> None:
        stem = st.path.stem if (st := self.state).path else (st.preset.name or "run")
        from ...run.export.render import FORMATS

        names = {"slurm": "SLURM (sbatch)", "pbs": "PBS (qsub)", "sh": "shell scripts (one per node)",
                 "kubeflow": "Kubeflow TrainJob", "skypilot": "SkyPilot task"}
        self.app.push_screen(Form("Export scripts", [("format", "format", "slurm"),
                                                     ("output", "directory", f"export/{stem}")],
                                  choices={"format": [(names.get(f, f), f) for f in FORMATS]}), self._export)

    def _export(self, ans: dict[str, Any] | None) -> None:
        if not ans:
            return
        from ...run.export.render import FORMATS, export_files
        from ...run.rundir import new_run_id

        fmt = str(ans["format"]).strip()
        if fmt not in FORMATS:
            self.app.push_screen(Notice("Not exported", f"format must be one of {', '.join(FORMATS)}, got {fmt!r}"))
            return
        st = self.state
        run_id = new_run_id(st.preset.name)
        out = Path(os.path.expanduser(ans["output"]))
        try:
            files = export_files(st.preset, fmt, run_id=run_id, base_dir=self.wizard.base_dir, facts=st.facts,
                                 preset_file=str(st.path.absolute()) if st.path else None)
            out.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                write_text_atomic(out / name, text, mode=0o755)  # never through a planted link
        except (OSError, ValueError) as e:
            self.app.push_screen(Notice("Not exported", str(e)))
            return
        self.notify(f"wrote {fmt} scripts to {out}", title="Export")

    # ---------------------------------------------------------------- launch
    def action_launch(self) -> None:
        """Asks first about errors and an output directory that holds a run (ui/launch_guard.py)."""
        self.wizard.launch_asking()
