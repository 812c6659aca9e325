"""After the demo: `qwen-tui chat` and `qwen-tui merge` on a run directory, as users run them (subprocesses of
the CLI), for a LoRA run (the demo with eval data, trained once for the session: tests/launch/conftest.py) and a
full fine-tuning run."""

from __future__ import annotations

import json

import pytest

from support.demo_run import EVAL_STEPS, demo_run, qwen_tui

pytestmark = pytest.mark.slow


def test_replay_with_eval_reports_the_eval_loss(demo_eval_run):
    """The demo with eval_data and eval_steps: eval records every EVAL_STEPS steps, and replay's end summary gives
    the last eval loss."""
    recs = [json.loads(ln) for ln in (demo_eval_run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in recs if r.get("event") == "eval"]
    assert [e["step"] for e in evals][:3] == [EVAL_STEPS, 2 * EVAL_STEPS, 3 * EVAL_STEPS]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]  # training lowers the eval loss too
    out = (demo_eval_run.parent.parent / "replay.out").read_text()
    assert f"last eval loss {evals[-1]['eval_loss']:.4f} at step {evals[-1]['step']}" in out
    # attach on the finished run says how it ended and what it trained, as replay's end did
    losses = [r["loss"] for r in recs if "loss" in r and "event" not in r]
    got = qwen_tui("attach", "last", "--runs-dir", str(demo_eval_run.parent), cwd=demo_eval_run)
    assert got.returncode == 0 and "already ended (ok)" in got.stdout, got.stdout + got.stderr
    assert f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} logged steps" in got.stdout, got.stdout
    assert f"last eval loss {evals[-1]['eval_loss']:.4f} at step {evals[-1]['step']}" in got.stdout


def test_chat_merge_chat_and_the_merged_loss(demo_eval_run):
    out = demo_eval_run.parent.parent / "out"
    # as the docs write it, from a directory with no runs/ in it: runs/<id> names the run of the runs root
    as_shown = ["--runs-dir", str(demo_eval_run.parent), f"runs/{demo_eval_run.name}"]
    got = qwen_tui("chat", *as_shown, "--prompt", "What is the capital of Chile?", "--json", cwd=demo_eval_run)
    assert got.returncode == 0, got.stderr[-3000:]
    before = json.loads(got.stdout)
    assert before["reply"].strip() and before["model"] == str(out)  # the adapter on its base

    got = qwen_tui("merge", *as_shown, "--json", cwd=demo_eval_run)
    assert got.returncode == 0, got.stderr[-3000:]
    rep = json.loads(got.stdout)
    assert rep["merged_dir"] == str(out / "merged") and (out / "merged" / "config.json").is_file()
    assert not (out / "merged.tmp").exists()
    assert rep["check"]["data"] == "builtin:demo-chat" and rep["check"]["records"] > 0

    # Without --prompt: a conversation on the terminal, one message a line; greedy, the merged model answers the
    # first as the adapter did.
    got = qwen_tui("chat", str(demo_eval_run), cwd=demo_eval_run, input="What is the capital of Chile?\nAnd of Peru?\n")
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.count("model> ") == 2 and f"model> {before['reply'].strip()}" in got.stdout

    # The merged model, reloaded here, has the adapter's eval loss on the demo data.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from support.worker import eval_loss_of

    tok = AutoTokenizer.from_pretrained(out)
    base_dir = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(out))
    merged = AutoModelForCausalLM.from_pretrained(out / "merged")
    la, lm = eval_loss_of(adapter, tok, "builtin:demo-chat", 256), eval_loss_of(merged, tok, "builtin:demo-chat", 256)
    base_loss = eval_loss_of(AutoModelForCausalLM.from_pretrained(base_dir), tok, "builtin:demo-chat", 256)
    assert abs(la - lm) <= 1e-4 * la
    assert lm < base_loss  # the merge kept what training learnt

    again = qwen_tui("merge", str(demo_eval_run), cwd=demo_eval_run)
    assert again.returncode == 1 and "already exists; --force replaces it" in again.stderr


def test_full_run_has_nothing_to_merge_and_chats(tmp_path):
    run = demo_run(tmp_path, method="full", max_steps=3, save_steps=100, learning_rate=0.0005)
    got = qwen_tui("merge", str(run), cwd=run)
    assert got.returncode == 0, got.stderr[-3000:]
    assert "holds a full fine-tuned model: nothing to merge" in got.stdout
    got = qwen_tui("chat", str(run), "--prompt", "Hi!", "--max-new-tokens", "8", "--json", cwd=run)
    assert got.returncode == 0, got.stderr[-3000:]
    assert json.loads(got.stdout)["tokens"] >= 1


def test_unfinished_or_missing_runs_are_refused(tmp_path):
    got = qwen_tui("merge", str(tmp_path), cwd=tmp_path)
    assert got.returncode == 2 and "not a qwen-tui run directory" in got.stderr
