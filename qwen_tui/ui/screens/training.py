"""Step 4, Training: the form on the left, the live panel on the right. Every
change goes through the App (pydantic validates; a bad value shows its error under
its input) and the panel recomputes: effective batch and its formula, memory per
GPU against the smallest GPU, step time, tokens/s, scaling, and the advice list
whose fixes apply with one key (F8 the first, Enter the highlighted one). F9 previews
the data (the launch API's preview_data, in a thread worker: the master tokenizes it)."""

from __future__ import annotations

import os
from typing import Any

from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.suggester import SuggestFromList
from textual.widgets import Input, Label, OptionList, Select, Static

from ...advice.report import NODES_WORTH_LIMIT
from ...advice.rules import Advice
from ...base.field_words import plain
from ...model.spec import known_hub_ids
from ...plan.estimate import GPUS
from ...run import api
from ..messages import ChangePreset, DataPreviewed
from ..styles import ERROR, FAIL, GOOD, NOTE_STRONG, WARNING, WARNING_STRONG, tone
from ..widgets.advice_list import AdviceList
from ..widgets.data_panel import BINS, DataPanel
from ..widgets.form_inputs import FieldInput, OrderedSelect
from .base import StepScreen

# What the model field completes as one types: the built-in tiny models and the known releases (dense, then the
# mixture-of-experts sizes), whose shapes the live estimate knows offline.
MODEL_SUGGESTIONS = ["builtin:tiny", "builtin:tiny-moe", "builtin:tiny-qwen2-moe", *known_hub_ids()]
# (dotted path, label, kind); kind: "text", "opt" (empty = None), or a list of Select choices
ON_OFF = [("on", True), ("off", False)]
FIELDS: list[tuple[str, str, Any]] = [
    ("name", "preset name", "opt"),
    ("training.model", "model (hub id or path)", "text"),
    ("training.data", "data (JSON/JSONL)", "opt"),  # empty with training.datasets (a mixture, in the YAML)
    ("training.stage", "stage", [("SFT", "sft"), ("DPO (preference pairs)", "dpo")]),
    ("training.pref_beta", "DPO beta", "text"),
    ("training.eval_data", "eval data (optional)", "opt"),
    ("training.eval_steps", "eval every N steps", "text"),
    ("training.method", "method", [("full", "full"), ("LoRA", "lora"), ("Q-LoRA", "qlora")]),
    ("training.lora_r", "LoRA rank r", "text"),
    ("training.lora_alpha", "LoRA alpha", "text"),
    ("training.lora_dropout", "LoRA dropout", "text"),
    ("training.zero_stage", "ZeRO stage", [("none (DDP)", "none"), ("ZeRO-2", 2), ("ZeRO-3", 3)]),
    ("training.precision", "precision", [("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32")]),
    ("training.fp8", "FP8 matmuls", [("auto: where measured faster", "auto"), ("on", "on"), ("off", "off")]),
    ("training.device", "device", [("auto", "auto"), ("GPU (cuda)", "cuda"), ("CPU", "cpu")]),
    ("training.model_max_length", "sequence length", "text"),
    ("training.sequence_parallel_size", "GPUs a sequence spans", "text"),
    ("training.per_device_train_batch_size", "batch per GPU", "text"),
    ("training.gradient_accumulation_steps", "accumulation", "text"),
    ("training.gradient_checkpointing", "gradient checkpointing", ON_OFF),
    ("training.learning_rate", "learning rate", "text"),
    ("training.num_train_epochs", "epochs", "text"),
    ("training.max_steps", "max steps (-1: epochs)", "text"),
    ("training.output_dir", "output dir", "text"),
    ("cluster.shared_storage", "output dir shared by all nodes",
     [("no: each node its own disk", False), ("yes: shared storage", True)]),
    ("training.save_steps", "save every N steps", "text"),
    ("training.save_total_limit", "keep checkpoints", "opt"),
    ("training.resume_from_checkpoint", "resume from", "opt"),
    # recovery (run/recovery/restarts.py, run/watch/watchdog.py, run/watch/health.py): the defaults said in the labels
    # and choices
    ("training.restarts", "relaunches (0: none)", "text"),
    ("training.exclude_failed", "after a node fails",
     [("relaunch on the same nodes", False), ("relaunch without it", True)]),
    ("monitor.hang_timeout", "hung after, seconds", "opt"),
    ("monitor.on_hang", "on a hang", [("alert: say so, train on", "alert"), ("stop every node", "stop"),
                                      ("stop, relaunch from ckpt", "restart")]),
    ("monitor.unreachable_timeout", "unreachable limit, s", "text"),
]
# What an empty field means, where empty is a value of its own
PLACEHOLDERS = {"monitor.hang_timeout": "auto: 5 step times, at least 120 s",
                "training.save_total_limit": "all", "training.resume_from_checkpoint": "start afresh"}
PATHS = {p for p, _, _ in FIELDS}
LABELS = {p: label for p, label, _ in FIELDS}
LOCAL_FILES = ("training.data", "training.eval_data", "training.model")  # checked on this machine as typed


# The GPU type to assume where no probe says (as the CLI's --gpu): kept by the wizard, not in the preset.
NO_GPU_TYPE = "probe"
GPU_CHOICES = [("none: use probe", NO_GPU_TYPE)] + [(name, name) for name in sorted(GPUS)]


def _wid(path: str) -> str:
    return path.replace(".", "-")


def _shown(v: Any) -> str:
    return "" if v is None else str(v)


class TrainingScreen(StepScreen):
    STEP = "training"
    AUTO_FOCUS = "#training-model"  # the first field: typing goes where a new user expects
    BINDINGS = [Binding("f8", "fix_first", "Apply fix"), Binding("f9", "preview_data", "Preview data")]

    def body(self) -> ComposeResult:
        t = self.state.preset
        with Horizontal(id="training-split"):
            with VerticalScroll(id="training-form"):
                for path, label, kind in FIELDS:
                    v = t.get_path(path)
                    with Horizontal(classes="form-row"):
                        yield Label(label, classes="field-label")
                        # initial values at construction: a Select set later would first
                        # announce its default option as a change
                        if isinstance(kind, list):
                            yield OrderedSelect(kind, id=_wid(path), allow_blank=False,
                                                value="none" if v is None else v, compact=True)
                        elif path == "training.model":  # completes the known releases, MoE sizes included
                            yield FieldInput(value=_shown(v), id=_wid(path), compact=True,
                                            suggester=SuggestFromList(MODEL_SUGGESTIONS, case_sensitive=False))
                        else:
                            yield FieldInput(value=_shown(v), id=_wid(path), compact=True,
                                             placeholder=PLACEHOLDERS.get(path, ""))
                    yield Static("", id=f"err-{_wid(path)}", classes="field-error")
                    if path == "training.device":
                        with Horizontal(classes="form-row"):
                            yield Label("GPU type", classes="field-label")
                            yield OrderedSelect(GPU_CHOICES, id="gpu-type", allow_blank=False,
                                                value=self.state.gpu or NO_GPU_TYPE, compact=True)
            with VerticalScroll(id="live"):
                yield Label("Live estimate", classes="section", id="estimate-title")
                yield Static(id="estimate")
                yield Label("Advice", classes="section")
                yield AdviceList(id="advice")
                yield Label("Data", classes="section")
                with VerticalScroll(id="data-box"):
                    yield DataPanel(id="data-preview")

    def on_screen_resume(self) -> None:
        self._fill_from_preset()
        super().on_screen_resume()

    def _fill_from_preset(self) -> None:
        """Another step (or a fix, or opening a preset) may have changed the values."""
        t = self.state.preset
        for path, _, kind in FIELDS:
            v = t.get_path(path)
            if isinstance(kind, list):
                w = self.query_one(f"#{_wid(path)}", Select)
                want = "none" if v is None else v
                if w.value != want:
                    w.value = want
            else:
                w = self.query_one(f"#{_wid(path)}", Input)
                if path in self.state.field_errors:
                    continue  # the refused text stays, with its error, until it is fixed
                err = self.query_one(f"#err-{_wid(path)}", Static)
                err.update("")
                err.set_class(False, "-shown")
                if w.value != _shown(v):
                    w.value = _shown(v)

    # ---------------------------------------------------------------- edits
    def on_input_changed(self, ev: Input.Changed) -> None:
        path = (ev.input.id or "").replace("-", ".")
        kind = next((k for p, _, k in FIELDS if p == path), None)
        if kind is None:
            return
        text = ev.value.strip()
        value: str | None = None if (kind == "opt" and not text) else text
        # every edit goes to the App, in order: whether it changes anything is for the App to say, when it
        # comes to it (the preset seen here may still lack the edits queued before this one)
        self.post_message(ChangePreset({path: value}))

    def on_select_changed(self, ev: Select.Changed) -> None:
        if ev.select.id == "gpu-type":
            gpu = None if ev.value == NO_GPU_TYPE else str(ev.value)
            if gpu != self.state.gpu:
                self.state.gpu = gpu
                self.wizard.facts_changed()
            return
        path = (ev.select.id or "").replace("-", ".")
        if path not in PATHS:
            return
        value = None if ev.value == "none" else ev.value
        self.change(path, value)

    def show_field_errors(self, errors: list, changes: dict[str, Any]) -> None:
        for path in changes:
            if path in PATHS:
                mine = [e for e in errors if e.path == path or e.path.startswith(path + ".")] or errors
                # in plain words, naming the field as the form labels it (not pydantic's own text)
                msg = "; ".join(plain(e.path, e.message, changes[path] if e.path == path else None, LABELS)
                                for e in mine)
                text = Text(msg, style=tone(FAIL)) if msg else self._path_note(path, changes[path])
                w = self.query_one(f"#err-{_wid(path)}", Static)
                w.update(text)
                w.set_class(bool(text.plain), "-shown")
                if msg:  # a small terminal may have scrolled it out of sight
                    self.call_after_refresh(w.scroll_visible, animate=False)

    def _path_note(self, path: str, value: Any) -> Text:
        """A data or model path that node 0 (this machine) does not have, said as it is typed: not refused
        (it may be copied there before the launch), but not left for the launch to find out."""
        nodes = self.state.preset.slots
        local = nodes[0].is_local or self.state.preset.scheduler.is_slurm  # SLURM's nodes share this machine's files
        if path not in LOCAL_FILES or not value or not local or str(value).startswith("builtin:"):
            return Text("")
        text = str(value)
        if path == "training.model" and not text.startswith(("/", ".", "~")):
            return Text("")  # a hub id (Qwen/Qwen2.5-7B-Instruct) is not a path
        where = os.path.join(self.wizard.base_dir, os.path.expanduser(text))
        if os.path.exists(where):
            return Text("")
        return Text(f"{LABELS[path]}: {text} does not exist on this machine (node 0) yet", style=tone(WARNING))

    # ---------------------------------------------------------------- panel
    def refresh_state(self) -> None:
        st = self.state
        # probed GPUs decide the fit (as --facts does for the CLI): the select is for when nobody probed
        probed = any(nf.gpus for nf in st.facts.nodes.values())
        gpu_select = self.query_one("#gpu-type", Select)
        gpu_select.disabled = probed
        gpu_select.tooltip = "the probe found the nodes' GPUs (Nodes step)" if probed else None
        est = st.estimate
        refused = [LABELS[p] for p in st.field_errors if p in LABELS]
        title = self.query_one("#estimate-title", Label)
        if refused:  # what it shows is of the old values, not of what the form holds
            title.update(Text(f"Live estimate: stale, {', '.join(refused)} refused (old value used)",
                              style=tone(WARNING_STRONG)))
        else:
            title.update("Live estimate")
        title.set_class(bool(refused), "-stale")
        t = Table.grid(padding=(0, 1))
        t.add_column(style="bold", min_width=10, max_width=16)
        t.add_column()
        if est is not None:
            if est.model:
                t.add_row("model", Text(est.model))
            t.add_row("effective batch", Text(str(est.effective_batch), style=tone(NOTE_STRONG)))
            t.add_row("", Text(est.batch_formula, style="dim"))
            if est.memory_gib is not None and st.gpu_unknown:  # green here would read as "it fits"
                t.add_row("memory per GPU", Text(f"{est.memory_gib:.1f} GiB", style=tone(WARNING)))
                t.add_row("", Text("GPU unknown: fit not checked (pick a GPU type, or probe the nodes)",
                                   style=tone(WARNING)))
            elif est.memory_gib is not None:
                fits = est.smallest_gpu_gib is None or est.memory_gib <= est.smallest_gpu_gib
                smallest = f" of {est.smallest_gpu_gib:.0f} GiB (smallest GPU)" if est.smallest_gpu_gib else ""
                t.add_row("memory per GPU", Text(f"{est.memory_gib:.1f} GiB{smallest}",
                                                 style=tone(GOOD) if fits else tone(ERROR)))
            else:
                t.add_row("memory per GPU", Text("-", style="dim"))
            gpu_run = not est.cpu  # the estimator models GPUs only
            step = est.step_seconds
            unknown = Text("unknown (see below)", style=tone(WARNING))
            t.add_row("step time", Text("< 0.01 s" if step < 0.01 else f"{step:.2f} s")
                      if step is not None and gpu_run else unknown if gpu_run else Text("-"))
            t.add_row("tokens/s", Text(f"{est.tokens_per_s:,.0f}") if est.tokens_per_s and gpu_run
                      else unknown if gpu_run else Text("-"))
            if gpu_run and not est.link_measured and len(st.preset.slots) > 1:
                scaling = Text("not measured (link speed unknown)", style=tone(WARNING))
            else:
                scaling = Text(f"{est.scaling * 100:.0f} % of linear" if est.scaling is not None and gpu_run else "-")
            t.add_row("scaling", scaling)
            if gpu_run and len(st.preset.slots) > 1:
                # the bandwidth the estimate uses between nodes, and where it came from (rehearsal, NICs, iperf3)
                bw = (f"{est.bandwidth_gbps:.3g} Gbit/s ({est.bandwidth_source}"
                      + (", a lower bound)" if est.bandwidth_lower_bound else ")")) if est.bandwidth_gbps else None
                t.add_row("between nodes", Text(bw or "not measured", style="" if bw else tone(WARNING)))
                if est.nodes_worth_it is not None:
                    most = est.nodes_worth_it >= NODES_WORTH_LIMIT  # every node up to the limit pays
                    t.add_row("worth up to", Text(f"{est.nodes_worth_it}{'+' if most else ''} node(s)"))
            else:
                slowest = st.facts.min_bandwidth_gbps()
                t.add_row("slowest link", Text(f"{slowest:.1f} Gbit/s" if slowest is not None else "not measured",
                                               style="dim" if slowest is None else ""))
            for n in est.notes:
                t.add_row("", Text(n, style="dim italic"))
        self.query_one("#estimate", Static).update(t)
        self.query_one(AdviceList).show(st.advice, gpu_unknown=st.gpu_unknown)
        panel = self.query_one(DataPanel)
        if panel.report is not None:
            panel.show_report(panel.report, stale=self._previewed != st.preset.model_dump_json())

    # ---------------------------------------------------------------- data preview
    _previewed: str | None = None  # the preset (as JSON) the shown preview is of

    def action_preview_data(self) -> None:
        preset = self.state.preset.model_copy(deep=True)
        master = preset.slots[0]
        transport = api.master_transport(preset, self.state.conns)
        panel = self.query_one(DataPanel)
        if transport is None:
            panel.show_error(f"node 0 ({master.label}) is not connected: connect in the SSH step (F2) first")
            return
        panel.show_running()
        self._preview_data(preset, transport, self.state.facts)

    @work(thread=True, exclusive=True, exit_on_error=False, group="data-preview")
    def _preview_data(self, preset, transport, facts) -> None:
        from ...run.tools.data_preview import DataPreviewError

        try:
            report = api.preview_data(preset, transport, facts, base_dir=self.wizard.base_dir,
                                      local_python=self.wizard.local_python, bins=BINS)
        except DataPreviewError as e:
            self.post_message(DataPreviewed(error=str(e)))
            return
        self.post_message(DataPreviewed(preset.model_dump_json(), report))

    def on_data_previewed(self, msg: DataPreviewed) -> None:
        panel = self.query_one(DataPanel)
        if msg.error:
            panel.show_error(msg.error)
            return
        self._previewed, report = msg.preset_json, msg.report
        panel.show_report(report, stale=self._previewed != self.state.preset.model_dump_json())

    # ---------------------------------------------------------------- fixes
    def _apply(self, item: Advice) -> None:
        if self.wizard.apply_fix(item):
            self._fill_from_preset()

    def fill_from_preset(self) -> None:  # the command palette's fixes land here
        self._fill_from_preset()

    def action_fix_first(self) -> None:
        """F8: the highlighted finding's fix (or what to do, when it has no automatic one);
        with nothing highlighted, the first finding that has a fix."""
        lst = self.query_one(AdviceList)
        item = lst.selected if lst.has_focus else None
        item = item or next((a for a in self.state.advice if a.fix is not None), None)
        if item is None:
            self.notify("no advice with a fix" if self.state.advice else "no advice", title="F8")
            return
        self._apply(item)

    def on_option_list_option_selected(self, ev: OptionList.OptionSelected) -> None:
        items = self.query_one(AdviceList).items
        idx = int(ev.option.id[1:]) if ev.option.id and ev.option.id.startswith("a") else None
        if idx is not None and idx < len(items):
            self._apply(items[idx])
