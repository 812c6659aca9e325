"""The small shell scripts that read and write files on a node (qwen_tui/nodes/remote/append_once.sh,
node_key.sh, key_authorized.sh, write_marker.sh, read_beats.sh, list_checkpoints.sh, slow_node_evidence.sh,
append_private.sh), run with sh on fake directories in tmp_path (HOME included) as the transports run them:
the text as `sh -c`'s script, what it works on as its arguments. Their output is read back with the callers'
own parsers."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from qwen_tui.nodes.programs import program
from qwen_tui.run.watch.evidence import parse_evidence
from qwen_tui.run.watch.watchdog import parse_beats


def sh(name: str, *args: str, home: Path | None = None, path: str = "/usr/bin:/bin", **kw):
    env = {"PATH": path, "HOME": str(home or "/nonexistent")}
    return subprocess.run(["sh", "-c", program(name), "sh", *args], capture_output=True, text=True, timeout=30,
                          env=env, **kw)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_append_once_adds_only_missing_lines_privately(tmp_path):
    hostile = "ssh-ed25519 AAAA $(touch pwned) 'quoted' * key"
    r = sh("append_once.sh", "authorized_keys", "ssh-ed25519 AAAA one", hostile, home=tmp_path)
    f = tmp_path / ".ssh" / "authorized_keys"
    assert r.returncode == 0 and r.stdout == "2\n" and f.read_text() == f"ssh-ed25519 AAAA one\n{hostile}\n"
    assert mode(tmp_path / ".ssh") == 0o700 and mode(f) == 0o600 and not (tmp_path / "pwned").exists()
    f.write_text(f.read_text() + "a line without its newline")
    r = sh("append_once.sh", "authorized_keys", hostile, "ssh-ed25519 AAAA two", home=tmp_path)
    assert r.stdout == "1\n" and f.read_text().splitlines()[-2:] == ["a line without its newline", "ssh-ed25519 AAAA two"]
    (tmp_path / "blocked").write_text("")
    assert sh("append_once.sh", "known_hosts", "x", home=tmp_path / "blocked").returncode == 90  # no ~/.ssh possible


def test_key_authorized_finds_a_key_by_its_text(tmp_path):
    assert sh("key_authorized.sh", "AAAA", home=tmp_path).returncode == 1  # no file
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAAC3Nz.x+y comment\n")
    assert sh("key_authorized.sh", "ssh-ed25519 AAAAC3Nz.x+y", home=tmp_path).returncode == 0
    assert sh("key_authorized.sh", "ssh-ed25519 AAAAC3Nz.*", home=tmp_path).returncode == 1  # text, not a pattern


def test_node_key_is_made_once_then_read_back(tmp_path):
    first = sh("node_key.sh", "qwen-tui@node1", home=tmp_path)
    assert first.returncode == 0, first.stderr
    line = first.stdout.strip()
    assert line.startswith("ssh-ed25519 ") and line.endswith(" qwen-tui@node1")
    assert mode(tmp_path / ".ssh" / "id_ed25519") == 0o600
    assert sh("node_key.sh", "another comment", home=tmp_path).stdout.strip() == line  # kept, not remade


def test_write_marker_uses_the_nearest_existing_parent_and_never_overwrites(tmp_path):
    r = sh("write_marker.sh", str(tmp_path / "out" / "run" / "deep"), "tok123", ".marker")
    assert r.returncode == 0 and r.stdout == str(tmp_path) and (tmp_path / ".marker").read_text() == "tok123"
    assert not (tmp_path / "out").exists()  # a check creates no directory
    again = sh("write_marker.sh", str(tmp_path), "other", ".marker")
    assert again.returncode != 0 and (tmp_path / ".marker").read_text() == "tok123"
    (tmp_path / "here").mkdir()
    assert sh("write_marker.sh", str(tmp_path / "here"), "t", ".m").stdout == str(tmp_path / "here")
    rel = sh("write_marker.sh", "relative/none", "t", ".rel", cwd=tmp_path)  # relative: to the workdir
    assert rel.stdout == "." and (tmp_path / ".rel").read_text() == "t"


def test_read_beats_prints_each_heartbeat_as_one_line(tmp_path):
    for rank, step in ((0, 7), (12, 6)):
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "step": step, "phase": "step"}))
    (tmp_path / "rank-3.json.tmp").write_text("{half")  # a file being replaced
    (tmp_path / "stack-rank-0.txt").write_text("Thread 1")
    r = sh("read_beats.sh", str(tmp_path))
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2
    beats = parse_beats(r.stdout)
    assert {k: v["step"] for k, v in beats.items()} == {0: 7, 12: 6}
    assert sh("read_beats.sh", str(tmp_path / "none")).returncode == 0  # nothing yet is not an error


def test_list_checkpoints_names_the_whole_ones_and_says_why_each_other_is_skipped(tmp_path):
    """The node-side check agrees with the worker's own (training/checkpoints/manifest.py): a manifest written by
    it, then each way a checkpoint is damaged."""
    from training.checkpoints import manifest

    def make(name, state="finetune_state.json", ranks=(0, 1)):
        d = tmp_path / name
        (d / "ds").mkdir(parents=True)
        if state:
            (d / state).write_text("{}")
        for r in ranks:
            (d / f"rng_state_{r}.pth").write_bytes(b"r" * (10 + r))
            (d / "ds" / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"x" * 100)
        (d / "adapter model.safetensors").write_bytes(b"w" * 50)  # a space in a name
        manifest.write(d, int(name.split("-")[1]), 2, ranks)
        return d

    make("checkpoint-10")
    make("checkpoint-20", state="trainer_state.json")
    (make("checkpoint-30") / "ds" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()  # a rank's shard lost
    (make("checkpoint-40") / "manifest.json").unlink()  # cut short before its manifest
    with open(make("checkpoint-50") / "adapter model.safetensors", "r+b") as f:
        f.truncate(7)  # a full disk
    make("checkpoint-60", state=None)
    (tmp_path / "other-70").mkdir()
    make("checkpoint-80").rename(tmp_path / "checkpoint-80.tmp")  # still being written
    r = sh("list_checkpoints.sh", str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.splitlines())
    assert [ln for ln in lines if not ln.startswith("#")] == ["checkpoint-10", "checkpoint-20"]
    assert "# checkpoint-30: ds/zero_pp_rank_1_mp_rank_00_optim_states.pt is missing" in lines
    assert any(ln.startswith("# checkpoint-40: no manifest.json") for ln in lines)
    assert "# checkpoint-50: adapter model.safetensors is 7 bytes, 50 when it was saved" in lines
    assert "# checkpoint-60: no finetune_state.json" in lines and len(lines) == 6
    # the worker's own verdicts, the same way
    assert [manifest.incomplete(tmp_path / f"checkpoint-{s}", s) is None for s in (10, 20, 30, 40, 50)] == \
        [True, True, False, False, False]
    assert "truncated" in manifest.incomplete(tmp_path / "checkpoint-50")
    none = sh("list_checkpoints.sh", str(tmp_path / "not-yet"))
    assert none.returncode == 0 and none.stdout == ""


def test_slow_node_evidence_reads_load_cores_and_gpus(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "$*" > "$(dirname "$0")/asked"\nprintf "97, 1980, 1980, 64\\n41, 1200, 1980, 83\\n"\n')
    smi.chmod(0o755)
    cores = os.cpu_count()
    with_gpus = sh("slow_node_evidence.sh", path=f"{bindir}:/usr/bin:/bin")
    assert with_gpus.returncode == 0
    assert (bindir / "asked").read_text().split() == [
        "--query-gpu=utilization.gpu,clocks.sm,clocks.max.sm,temperature.gpu", "--format=csv,noheader,nounits"]
    parts = parse_evidence(with_gpus.stdout)
    assert parts[0].startswith("CPU load ") and parts[0].endswith(f" on {cores} cores")
    assert parts[1] == "GPUs 97% at 1980/1980 MHz, 64 C; 41% at 1200/1980 MHz, 83 C"
    without = sh("slow_node_evidence.sh", path="/usr/bin:/bin")
    assert without.returncode == 0 and len(without.stdout.splitlines()) == 2 and len(parse_evidence(without.stdout)) == 1


def test_append_private_makes_a_new_file_0600_and_appends(tmp_path):
    f = tmp_path / "gpus.jsonl"
    assert sh("append_private.sh", str(f), input='{"a": 1}\n').returncode == 0
    assert sh("append_private.sh", str(f), input='{"a": 2}\n').returncode == 0
    assert f.read_text() == '{"a": 1}\n{"a": 2}\n' and mode(f) == 0o600
