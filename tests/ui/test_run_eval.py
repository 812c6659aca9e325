"""Eval in the loop, in the wizard: the demo launched with eval_data and eval_steps writes eval records, and the
Run screen's loss panel and end status show the eval loss the worker wrote. Then `c` chats with the result, `m`
merges it, and the shipped DPO preset (the shipped DPO preset), opened in the same wizard, trains on the
merged model: SFT, merge, DPO and chat without leaving it."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from qwen_tui.ui.app import WizardApp
from qwen_tui.ui.widgets.loss_chart import LossChart
from support.paths import DEMO_DPO
from support.pilot import SIZE, wait_until
from support.ports import free_port
from support.procs import run_processes

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_demo_with_eval_shows_the_eval_loss(tmp_path, demo_copy, monkeypatch, stop_runs_after):
    preset = demo_copy(max_steps=10, logging_steps=1, save_strategy="no", eval_data="builtin:demo-chat",
                       eval_steps=5)
    runs = tmp_path / "runs"
    stop_runs_after(runs)
    monkeypatch.chdir(tmp_path)
    app = WizardApp(str(preset), runs_root=str(runs), reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        assert app.screen.query_one("#training-eval_steps").value == "5"  # shown in the Training step
        assert app.screen.query_one("#training-eval_data").value == "builtin:demo-chat"
        await pilot.press("f5")
        await pilot.pause()
        await pilot.press("l")
        if app.screen.is_modal:
            await pilot.press("y")
        run = app.get_screen("run")
        await wait_until(pilot, lambda: app.state.run_status in ("ok", "failed", "stopped"), 300, "the run's end")
        assert app.state.run_status == "ok", str(run.query_one("#run-status").render())
        run_id = run.launcher.plan.run_id
        recs = [json.loads(ln) for ln in (runs / run_id / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in recs if r.get("event") == "eval"]
        assert [e["step"] for e in evals][:2] == [5, 10]  # every 5 steps (and perhaps once more at the end)
        last = evals[-1]
        await wait_until(pilot, lambda: "eval loss" in run.query_one(LossChart).summary, 10, "the eval loss")
        assert f"eval loss {last['eval_loss']:.4f}" in run.query_one(LossChart).summary
        status = str(run.query_one("#run-status").render())
        assert f"last eval loss {last['eval_loss']:.4f} at step {last['step']}" in status

        # After the finished run: a chat with its model (the adapter on its base, on the master)
        await pilot.press("c")
        await pilot.pause()
        from qwen_tui.ui.chat import ChatScreen

        chat = app.screen
        assert isinstance(chat, ChatScreen)
        box = chat.query_one("#chat-input")
        box.value = "What is the capital of Chile?"
        await pilot.press("enter")
        await wait_until(pilot, lambda: not chat.busy and len(chat.messages) == 2 or "✘" in _lines(chat), 120,
                         "the model's reply")
        assert chat.messages[0] == {"role": "user", "content": "What is the capital of Chile?"}, _lines(chat)
        assert chat.messages[1]["role"] == "assistant"
        assert f"model  {chat.messages[1]['content'] or '(an empty reply)'}" in _lines(chat)
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is run

        # `m`: the adapter merged into its base on the master, the model the next stage starts from
        merged = tmp_path / "out" / "merged"
        await pilot.press("m")
        await wait_until(pilot, lambda: (merged / "config.json").is_file(), 300, "the merged model")

        # The second stage in the same wizard: the shipped DPO preset, on this run's merged model
        dpo = yaml.safe_load(DEMO_DPO.read_text())
        dpo["network"]["master_port"] = free_port()
        dpo["training"].update({"model": str(merged), "output_dir": str(tmp_path / "dpo-out"), "max_steps": 4,
                                "logging_steps": 1, "save_strategy": "no"})
        (tmp_path / "dpo.yaml").write_text(yaml.safe_dump(dpo, sort_keys=False))
        app._open({"path": str(tmp_path / "dpo.yaml")})  # what ctrl+o's form hands over
        await pilot.pause()
        assert app.state.preset.training.stage == "dpo"
        await pilot.press("f5")
        await pilot.pause()
        await pilot.press("l")
        if app.screen.is_modal:
            await pilot.press("y")
        await wait_until(pilot, lambda: run.launcher is not None and run.launcher.plan.run_id != run_id, 60,
                         "the DPO launch")
        await wait_until(pilot, lambda: app.state.run_status in ("ok", "failed", "stopped"), 300, "the DPO run's end")
        assert app.state.run_status == "ok", str(run.query_one("#run-status").render())
        dpo_id = run.launcher.plan.run_id
        steps = [r for r in map(json.loads, (runs / dpo_id / "metrics.jsonl").read_text().splitlines())
                 if "event" not in r]
        assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5) and len(steps) == 4
        await wait_until(pilot, lambda: "reward accuracy" in run.query_one(LossChart).summary, 10, "the rewards")
        await pilot.press("ctrl+q")
    assert run_processes(run_id) == [] and run_processes(dpo_id) == []


def _lines(chat) -> str:
    from textual.widgets import Static

    return "\n".join(str(w.content) for w in chat.query(".chat-line").results(Static))
