"""Eval in the loop on qwen-tui's side: the preset fields, the worker flags, and the eval records followed."""


import pytest
from rich.console import Console

from qwen_tui.plan.launch import worker_args
from qwen_tui.preset.files import load_preset
from qwen_tui.preset.schema import PresetError
from qwen_tui.run.watch.metrics import TrainingProgress
from support.paths import ROOT


def test_eval_fields_reach_the_worker():
    p = load_preset(ROOT / "presets" / "local-demo.yaml")
    assert "--eval_data_path" not in worker_args(p.training, metrics_file="m")
    p.training.eval_data = "eval.jsonl"
    a = worker_args(p.training, metrics_file="m")
    assert a[a.index("--eval_data_path") + 1] == "eval.jsonl" and "--eval_steps" not in a  # at the end only
    p.training.eval_steps = 25
    a = worker_args(p.training, metrics_file="m")
    assert a[a.index("--eval_steps") + 1] == "25"


def test_eval_steps_without_eval_data_is_refused(tmp_path):
    text = (ROOT / "presets" / "local-demo.yaml").read_text().replace("  logging_steps: 5", "  logging_steps: 5\n"
                                                                         "  eval_steps: 10")
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(PresetError) as e:
        load_preset(f)
    assert "training.eval_steps: evaluating every 10 steps needs training.eval_data" in str(e.value.problems)


def test_progress_keeps_the_evals_and_the_live_view_shows_the_last():
    prog = TrainingProgress()
    for rec in [{"event": "start", "total_steps": 20}, {"step": 5, "loss": 3.0},
                {"event": "eval", "step": 5, "eval_loss": 2.75, "eval_tokens": 100},
                {"event": "checkpoint", "step": 5}, {"step": 10, "loss": 2.5},
                {"event": "eval", "step": 10, "eval_loss": 2.25, "eval_tokens": 100}]:
        prog.add(rec)
    assert [e["eval_loss"] for e in prog.evals] == [2.75, 2.25] and prog.last_eval["step"] == 10

    import io
    from types import SimpleNamespace

    from qwen_tui.cli import live

    # what render reads of a Launcher: the plan's nodes, their states, the metrics (a run of no nodes here), the
    # note about earlier attempts (none: a first attempt)
    la = SimpleNamespace(plan=SimpleNamespace(run_id="r", nodes=[]), nodes={}, metrics=SimpleNamespace(progress=prog),
                         attempt_note=None)
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(live.render(la))
    text = out.getvalue()
    assert "loss 2.5000" in text and "eval loss 2.2500 (step 10)" in text
