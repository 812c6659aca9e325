"""Following metrics.jsonl: only appended bytes are read, partial lines wait, events are not steps."""

import json

from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.run.watch.metrics import MetricsFollower, fmt_duration


def test_follow_appends_partial_lines_and_events(tmp_path):
    f = tmp_path / "metrics.jsonl"
    f.write_text(json.dumps({"event": "start", "total_steps": 10, "time": 0.0}) + "\n")
    fol = MetricsFollower(LocalTransport(), str(f))
    assert [r["event"] for r in fol.poll()] == ["start"]
    assert fol.poll() == []
    step1 = json.dumps({"step": 1, "loss": 2.0, "time": 10.0})
    with f.open("a") as fh:
        fh.write(step1 + "\n" + step1[:10])  # the writer is mid-line
    assert [r["step"] for r in fol.poll()] == [1]
    with f.open("a") as fh:
        fh.write(step1[10:].replace('"step": 1', '"step": 1') + "\n")
        fh.write(json.dumps({"step": 3, "loss": 1.5, "time": 30.0}) + "\n")
        fh.write(json.dumps({"event": "checkpoint", "step": 3, "time": 31.0}) + "\n")
        fh.write("not json\n")
    fol.poll()
    p = fol.progress
    assert [s["step"] for s in p.steps] == [1, 1, 3]
    assert p.last["loss"] == 1.5 and p.losses == [2.0, 2.0, 1.5]
    assert [e["event"] for e in p.events] == ["checkpoint"]
    assert fol.bad_lines == 1
    # 2 steps in 20 s: 7 steps to go at 10 s a step
    assert p.eta_seconds() == 70.0
    assert fmt_duration(70.0) == "1:10" and fmt_duration(3725) == "1:02:05" and fmt_duration(None) == "-"


def test_missing_file_is_empty(tmp_path):
    fol = MetricsFollower(LocalTransport(), str(tmp_path / "nope.jsonl"))
    assert fol.poll() == [] and fol.progress.start is None


def test_kept_copy_matches_what_was_read_and_a_reattach_adds_no_duplicates(tmp_path):
    src, kept = tmp_path / "master-metrics.jsonl", tmp_path / "run" / "metrics.jsonl"
    kept.parent.mkdir()
    src.write_text(json.dumps({"event": "start", "total_steps": 2}) + "\n" + '{"step": 1, "lo')
    fol = MetricsFollower(LocalTransport(), str(src), keep=str(kept))
    fol.poll()
    assert kept.read_bytes() == src.read_bytes()  # a partial line is kept as read: the rest follows
    with src.open("a") as fh:
        fh.write('ss": 2.0}\n' + json.dumps({"event": "end", "status": "ok"}) + "\n")
    fol.poll()
    assert kept.read_bytes() == src.read_bytes()
    # qwen-tui re-attached: a new follower reads from the start again
    again = MetricsFollower(LocalTransport(), str(src), keep=str(kept))
    again.poll()
    assert kept.read_bytes() == src.read_bytes()
    assert [json.loads(x).get("event") for x in kept.read_text().splitlines()] == ["start", None, "end"]
