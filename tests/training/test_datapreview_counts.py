"""`qwen-tui data PRESET --json` counts what the worker counts: the demo preset previewed through the CLI (as
users run it, in a subprocess that imports no torch) against the worker's own start record and log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from qwen_tui.plan.launch import worker_args
from qwen_tui.preset.files import load_preset, save_preset
from support.paths import ROOT
from support.worker import assert_ok, run_worker

KEYS = {"records", "usable", "dropped", "truncated", "tokens", "supervised_tokens", "length_percentiles",
        "tokens_per_epoch", "epoch_seconds"}


def _qwen_tui(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "qwen_tui.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_data_json_agrees_with_the_worker(tmp_path):
    preset = load_preset(ROOT / "presets" / "local-demo.yaml")
    # The demo's records are 30 to 131 tokens: at 96 some are cut, which the preview must count as the worker does.
    preset.training.model_max_length = 96
    preset.training.output_dir = str(tmp_path / "out")
    path = tmp_path / "demo.yaml"
    save_preset(preset, path)

    got = _qwen_tui("data", str(path), "--json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    rep = json.loads(got.stdout)
    assert KEYS <= rep.keys()
    assert set(rep["length_percentiles"]) == {"p50", "p90", "p99", "max"}

    run = run_worker(tmp_path / "out", *worker_args(preset.training, metrics_file=str(tmp_path / "out" / "metrics.jsonl")),
                     "--max_steps", "1", "--save_strategy", "no")
    assert_ok(run)
    start = run.event("start")[0]
    assert rep["records"] == start["records"] == 400
    assert rep["usable"] == start["usable_records"]
    assert rep["dropped"] == start["dropped_records"]
    assert rep["truncated"] == start["truncated_records"] > 0
    assert rep["tokens"] == start["tokens"] and rep["supervised_tokens"] == start["supervised_tokens"] > 0
    # and as the worker logs them ("DATA: N records, T tokens, S of them supervised")
    logged = re.search(r": (\d+) records, (\d+) tokens, (\d+) of them supervised", run.stderr)
    assert logged, run.stderr[-2000:]
    assert (rep["records"], rep["tokens"], rep["supervised_tokens"]) == tuple(map(int, logged.groups()))

    # Epoch arithmetic of the preset's two processes; more than 1% truncated -> the warning with the p99 fix.
    assert rep["steps_per_epoch"] == rep["usable"] // 16
    assert rep["length_percentiles"]["max"] > 96 >= rep["length_percentiles"]["p50"]
    assert sum(rep["histogram"]["counts"]) == 400
    warn = {a["code"]: a for a in rep["advice"]}["DATA_TRUNCATED"]
    assert warn["fix"]["changes"] == {"training.model_max_length": rep["length_percentiles"]["p99"]}
    assert rep["epoch_seconds"] is None  # a CPU preset: the estimate has no tokens/s for it


def test_data_text_and_bad_data(tmp_path):
    preset = load_preset(ROOT / "presets" / "local-demo.yaml")
    path = tmp_path / "demo.yaml"
    save_preset(preset, path)
    got = _qwen_tui("data", str(path), "--tokens-per-second", "1000", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert "records 400: 400 usable, 0 dropped, 0 truncated" in got.stdout
    m = re.search(r"time: (\d+) s an epoch, (\d+) s the run at 1,000 tokens/s", got.stdout)
    assert m, got.stdout
    # 22,597 tokens an epoch at 1,000 tokens/s, padding aside; the run is 60 steps of an epoch's 25
    assert 22 <= int(m[1]) <= 25 and abs(int(m[2]) - int(m[1]) * 60 / 25) <= 2
    assert got.stdout.count("│") >= 10  # the histogram's bars

    # a file with several kinds of mistakes: every kind is reported in one run, with its count and first records
    good = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'
    lines = [good, '{"messages": [{"role": "user", "content": "hi"}]}', good, '{"messages": [oops}',
             '{"conversations": [{"from": "bot", "value": "x"}]}', '{"messages": [{"role": "user", "content": "a"}]}',
             '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]}',
             '{"messages": [{"role": "user", "content": "b"}]}', '{"messages": [{"role": "user", "content": "c"}]}',
             '{"messages": [{"role": "user", "content": "d"}]}', '[1, 2]']
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    preset.training.data = str(bad)
    save_preset(preset, path)
    got = _qwen_tui("data", str(path), cwd=tmp_path)
    assert got.returncode == 1
    err = got.stderr
    assert "9 problem(s) in 11 record(s), 5 kind(s)" in err, err[-3000:]
    assert "5 x no assistant turn (nothing to learn from)" in err
    assert "line 2, record 1 (id '#1'): no assistant turn" in err and "... and 2 more" in err
    assert "1 x invalid JSON" in err and "line 4, record 3" in err
    assert "1 x conversations[n] has unknown role '…'" in err and "unknown role 'bot'" in err
    assert "1 x messages[n] is an empty assistant reply" in err and "1 x expected a JSON object, got list" in err
