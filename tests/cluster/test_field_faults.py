"""Long-run faults on the namespace cluster, injected for real while `qwen-tui replay` runs as a login user:

- SSH to the master cut for 30 s mid-run (port 22 only): the run finishes ok, replay said the node was
  unreachable and then back, and the run directory's metrics hold every step once;
- SSH to a node cut past monitor.unreachable_timeout with on_unreachable stop: the node is named and every
  node is stopped, nothing left behind;
- one rank stopped (SIGSTOP): the watchdog names that node and rank within the bound, every rank that could
  answer left its stack in the run directory, and with on_hang restart the run resumes from its checkpoint
  and finishes;
- one node's CPU throttled (a cgroup CPU quota): a STRAGGLER warning names that node.
"""

from __future__ import annotations

import json
import os
import signal
import time

from support.field_run import CpuThrottle, no_job_left, records, steps_of


def test_ssh_to_the_master_cut_for_30_s_mid_run_the_run_finishes_with_every_step(field, tmp_path):
    steps = 200
    rp = field.replay(field.preset("blip", max_steps=steps), tmp_path / "replay.log")
    try:
        rd = rp.run_dir()
        rp.wait_step(rd.name, 3)
        field.cut_ssh(0)
        cut_at = time.monotonic()
        rp.wait_for("the master named unreachable", lambda: "node 0 (node0) unreachable" in rp.text(), 25)
        time.sleep(max(0.0, 30 - (time.monotonic() - cut_at)))
        field.mend_ssh(0)
        rc = rp.finish(300)
        out = rp.text()
        assert rc == 0 and "Traceback" not in out, out[-4000:]
        assert "training finished on every node" in out
        assert "node 0 (node0) reachable again after" in out, out[-4000:]
        assert out.index("node 0 (node0) unreachable") < out.index("node 0 (node0) reachable again")
        # the worker went on during the cut: its own record passed the step where SSH was cut
        kept = steps_of(rd / "metrics.jsonl")
        assert kept == list(range(1, steps + 1)), f"steps kept by replay: {kept[:5]}...{kept[-5:]} ({len(kept)})"
        notices = [json.loads(ln)["kind"] for ln in (rd / "notices.jsonl").read_text().splitlines()]
        assert notices[:2] == ["UNREACHABLE", "REACHABLE"], notices
        assert json.loads((rd / "state.json").read_text())["status"] == "ok"
    finally:
        field.mend_ssh(0)
        rp.close()


def test_ssh_cut_past_the_bound_stops_every_node_and_names_it(field, tmp_path):
    # the checks and the rehearsal ran in the first test: these launch at once, as replay --skip-checks does.
    # The smallest bound the schema takes: past it is past it, and each second of it is waited for.
    rp = field.replay(field.preset("cut", max_steps=100000, monitor={"unreachable_timeout": 5}),
                      tmp_path / "replay.log", "--skip-checks")
    try:
        rd = rp.run_dir()
        rp.wait_step(rd.name, 3)
        field.cut_ssh(1)
        rc = rp.finish(240)
        out = rp.text()
        assert rc == 1 and "Traceback" not in out, out[-4000:]
        assert "node 1 (node1) unreachable for more than 5 s" in out, out[-4000:]
        assert "(node 1 is unreachable: its log cannot be read now)" in out, out[-4000:]
        state = json.loads((rd / "state.json").read_text())
        assert state["status"] == "failed" and state["failed_rank"] == 1, state
        assert "unreachable for more than 5 s" in state["message"]
        # the other nodes were stopped; node 1's ranks lost their peers and ended on their own, SSH or not
        assert no_job_left(field.cluster, 60) == {}
    finally:
        field.mend_ssh(1)
        rp.close()


def test_a_stopped_rank_is_named_with_every_stack_and_the_run_restarts_from_its_checkpoint(field, tmp_path):
    steps = 40
    rp = field.replay(field.preset("hang", max_steps=steps, save_strategy="steps", save_steps=4,
                                   save_total_limit=None, restarts=1,
                                   monitor={"hang_timeout": 15, "on_hang": "restart"}),
                      tmp_path / "replay.log", "--skip-checks")
    frozen: list[int] = []
    try:
        rd = rp.run_dir()
        rp.wait_step(rd.name, 6)
        frozen = field.rank_pids(2)
        assert frozen, "no rank on node 2"
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        rp.wait_for("a HANG naming node 2", lambda: "HANG:" in rp.text(), 120)
        named_after = time.monotonic() - stopped_at
        out = rp.text()
        line = next(ln for ln in out.splitlines() if "HANG:" in ln)
        assert "node 2 (node2), rank 2" in line and "heartbeat stopped" in line, line
        assert named_after < 15 + 5 + 10 + 40, named_after  # bound + a heartbeat read + staleness + stacks
        stacks = sorted((rd / "stacks").glob("attempt-1-step-*"))
        assert len(stacks) == 1, stacks
        summary = json.loads((stacks[0] / "summary.json").read_text())
        # ranks 0 and 1 wait in a collective and answer; rank 2 is stopped and cannot (no py-spy here)
        for r in ("0", "1"):
            assert summary[r].startswith("ok"), summary
            text = next(stacks[0].glob(f"*-rank{r}.txt")).read_text()
            assert "step_loop.py" in text or "finetune.py" in text, text[:2000]
        assert not summary["2"].startswith("ok") or (stacks[0] / "node2-rank2.txt").is_file(), summary
        for pid in frozen:  # the relaunch killed them; a SIGCONT to a pid gone is harmless
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        frozen = []
        rc = rp.finish(300)
        out = rp.text()
        assert rc == 0, out[-4000:]
        state = json.loads((rd / "state.json").read_text())
        assert state["status"] == "ok" and len(state["attempts"]) == 2, state
        assert state["attempts"][0]["cause"] == "HANG", state["attempts"][0]
        assert state["attempts"][1].get("resume_from"), state["attempts"][1]
        assert max(steps_of(rd / "metrics.jsonl")) == steps
        # attach shows the finding and where the stacks are, as replay did
        seen = field.qwen_tui(tmp_path / "attach.log", "attach", rd.name, runs=rd.parent)
        assert "HANG:" in seen and "node 2 (node2), rank 2" in seen and str(stacks[0]) in seen, seen
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        rp.close()


def test_a_throttled_node_is_named_a_straggler(field, tmp_path):
    rp = field.replay(field.preset("slow", max_steps=60), tmp_path / "replay.log", "--skip-checks")
    cg = None
    try:
        rd = rp.run_dir()
        rp.wait_step(rd.name, 2)
        # 3% of one CPU: a tiny-model rank needs only ~15% of one, so a gentler cap may not bite on an idle machine
        cg = CpuThrottle(f"qt-slow-{os.getpid()}", percent=3)
        for pid in field.rank_pids(1):
            cg.add(pid)
        rp.wait_for("a STRAGGLER warning", lambda: "STRAGGLER:" in rp.text(), 180)
        line = next(ln for ln in rp.text().splitlines() if "STRAGGLER:" in ln)
        assert "node 1 (node1)" in line and "slower than the other nodes" in line, line
        assert "CPU load" in line, line
        recs = [r for r in records(field.live_metrics(rd.name)) if r.get("rank_compute_s")]
        assert recs and len(recs[-1]["rank_compute_s"]) == 3, recs[-1:]
    finally:
        if cg is not None:
            cg.remove()
        rp.close()


def test_machines_that_vanish_are_named_at_once_blamed_alone_and_the_run_finishes_on_the_others(field, tmp_path):
    """Node 1 goes as a crashed or rebooted machine (its processes gone, every TCP segment answered with a reset),
    then, in the relaunch, node 2 goes silent (every packet dropped, its processes frozen). Each time the run names
    that node within 30 s, no survivor, relaunches without it from the last complete checkpoint (though it cannot
    be reached to stop it), and the run finishes on node 0."""
    steps, save = 80, 5
    rp = field.replay(field.preset("vanish", max_steps=steps, save_strategy="steps", save_steps=save,
                                   save_total_limit=2, restarts=2, exclude_failed=True),
                      tmp_path / "replay.log", "--skip-checks")
    frozen: list[int] = []
    try:
        rd = rp.run_dir()
        rp.wait_step(rd.name, save + 3)
        field.vanish(1, "reset")
        gone_at = time.monotonic()
        rp.wait_for("node 1 blamed", lambda: "node 1 (node1) failed" in rp.text(), 60)
        assert time.monotonic() - gone_at < 30, rp.text()[-3000:]
        rp.wait_for("attempt 2", lambda: "attempt 2:" in rp.text(), 60)
        out = " ".join(rp.text().split())  # the console wraps long lines
        said = out[out.index("node 1 (node1) failed"):]
        # the survivors either fail at once with communication errors, or wait in a collective for a peer that
        # will never answer: either is evidence, and the summary says which
        by_errors = said.startswith("node 1 (node1) failed: stopped answering while the other nodes failed with "
                                    "communication errors; cause: the machine went away")
        by_stall = said.startswith("node 1 (node1) failed: stopped answering over SSH while its training peers, "
                                   "alive, finished no step; cause: the machine went away")
        assert by_errors or by_stall, said[:600]
        evidence = said.split("evidence: ", 1)[1]
        assert evidence.startswith("node 1 (node1) stopped answering over SSH" if by_errors else
                                   "node 1 (node1) lost: unreachable over SSH"), evidence[:2000]
        assert ("failed with a communication error" if by_errors else "its training peers lost it too") in \
            evidence, evidence[:2000]
        first = json.loads((rd / "state.json").read_text())["attempts"][0]
        assert first["cause"] == "MACHINE_LOST" and first["failed_node"] == "node1", first

        resumed = json.loads((rd / "state.json").read_text())["attempts"][1]
        assert resumed["nodes"] == ["node0", "node2"] and resumed["resume_from"], resumed
        at = int(resumed["resume_from"].rsplit("-", 1)[1])
        rp.wait_step(rd.name, at + save + 3)
        frozen = field.vanish(2, "silent")
        gone_at = time.monotonic()
        # node2 is node 1 of the second attempt: named lost (a notice), then blamed once every node is stopped
        rp.wait_for("node2 named", lambda: "node 1 (node2) lost" in rp.text(), 60)
        assert time.monotonic() - gone_at < 30, rp.text()[-3000:]
        rp.wait_for("node2 blamed", lambda: "node 1 (node2) failed" in rp.text(), 60)
        rc = rp.finish(300)
        out = rp.text()
        assert rc == 0 and "Traceback" not in out, out[-4000:]
        assert "node 1 (node2) lost: unreachable over SSH" in out and "its training peers lost it too" in out
        for survivor in ("node 0 (node0) failed:", "node 2 (node2) failed:", "node 0 (node0) hung"):
            assert survivor not in out, out[-4000:]
        for ln in (ln for ln in out.splitlines() if "HANG:" in ln):  # a hang, if one is called, names node2 alone
            assert "(node2)" in ln and "node0" not in ln, ln
        state = json.loads((rd / "state.json").read_text())
        assert state["status"] == "ok" and len(state["attempts"]) == 3, state
        assert [a.get("cause") for a in state["attempts"][:2]] == ["MACHINE_LOST", "MACHINE_LOST"], state["attempts"]
        assert state["attempts"][2]["nodes"] == ["node0"] and state["attempts"][2]["resume_from"], state["attempts"]
        assert int(state["attempts"][2]["resume_from"].rsplit("-", 1)[1]) > at
        assert max(steps_of(rd / "metrics.jsonl")) == steps
    finally:
        rp.close()
        field.mend(1, [])
        field.mend(2, frozen)
    assert no_job_left(field.cluster, 60) == {}
