"""Secrets stay out of argv and printed output; temp files are never written through a
planted link; exports land where the user said. Real processes and real files;
the node-side shell scripts of the SSH transport run here through `sh` (the SSH
channel is the only part not exercised: tests/cluster/test_attach_cluster.py does that)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from qwen_tui.nodes.jobs import JobRef, job_verdict, stop_job
from qwen_tui.nodes.transport.local import LocalTransport
from support.paths import DEMO, ROOT
from support.shell_here import ShellHere

SECRET = "hf_TopSecret_4242"


def _cli(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qwen_tui.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "250", "PYTHONPATH": str(ROOT)})


def _preset_with_secret(tmp_path: Path, data: str = "builtin:demo-chat") -> Path:
    d = yaml.safe_load(DEMO.read_text())
    d["network"]["env"] = {"HF_TOKEN": SECRET, "WANDB_API_KEY": SECRET + "w", "MY_NOTE": "a\x1b[2Jb"}
    d["training"]["data"] = data
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


# ---------------------------------------------------------------- printed output

def test_dry_run_masks_secrets_and_escapes_control_characters(tmp_path):
    p = _preset_with_secret(tmp_path, data="data\x1b]0;pwned\x07.jsonl")
    res = _cli("replay", str(p), "--dry-run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert SECRET not in out and "HF_TOKEN=***" in out and "WANDB_API_KEY=***" in out
    assert "\x1b" not in out and "\x07" not in out
    assert "MY_NOTE=a\\x1b[2Jb" in out and "data\\x1b]0;pwned\\x07.jsonl" in out


@pytest.mark.parametrize("fmt", ["sh", "slurm", "pbs"])
def test_export_writes_no_secret_and_reads_it_from_the_environment(tmp_path, fmt):
    p = _preset_with_secret(tmp_path)
    out = tmp_path / "out"
    res = _cli("export", str(p), "--format", fmt, "-o", str(out) + "/", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    scripts = list(out.iterdir())
    assert scripts
    for s in scripts:
        text = s.read_text()
        assert SECRET not in text
        assert "${HF_TOKEN:?set HF_TOKEN in the environment" in text
        assert subprocess.run(["bash", "-n", str(s)]).returncode == 0


def test_exported_sh_script_gets_the_secret_from_its_environment(tmp_path):
    d = yaml.safe_load(DEMO.read_text())
    d["network"]["env"] = {"HF_TOKEN": SECRET}
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    assert _cli("export", str(p), "--format", "sh", "-o", str(tmp_path / "sh"), cwd=tmp_path).returncode == 0
    script = (tmp_path / "sh" / "node-0.sh").read_text()
    # run its environment part for real, with the command swapped for one that prints the variable
    head = script[:script.index("\nexec ")]
    probe = head + '\nprintf %s "$HF_TOKEN"\n'
    ok = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env={**os.environ, "HF_TOKEN": "from-env"})
    assert ok.returncode == 0 and ok.stdout == "from-env", ok.stderr
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    missing = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env=env)
    assert missing.returncode != 0 and "set HF_TOKEN in the environment" in missing.stderr


# ---------------------------------------------------------------- exports: where and how they are written

def test_export_to_dir_with_slash_writes_into_the_dir(tmp_path):
    (tmp_path / "dir").mkdir()
    res = _cli("export", str(DEMO), "--format", "slurm", "-o", "dir/", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "dir").is_dir() and len(list((tmp_path / "dir").glob("*.sbatch"))) == 1


def test_export_sh_onto_an_existing_file_is_a_clear_error(tmp_path):
    f = tmp_path / "existing"
    f.write_text("keep me\n")
    res = _cli("export", str(DEMO), "--format", "sh", "-o", str(f), cwd=tmp_path)
    assert res.returncode == 2
    assert "exists and is not a directory" in res.stderr and "Traceback" not in res.stderr
    assert f.read_text() == "keep me\n"


def test_export_never_writes_through_a_planted_temp_link(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    (out / ".node-0.sh.tmp").symlink_to(victim)
    res = _cli("export", str(DEMO), "--format", "sh", "-o", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert victim.read_text() == "precious\n" and victim.stat().st_mode & 0o777 == 0o600
    assert "exec " in (out / "node-0.sh").read_text()


def test_local_copy_never_writes_through_a_planted_part_link(tmp_path):
    src = tmp_path / "chat.jsonl"
    src.write_text("new data\n")
    dst_dir = tmp_path / "node"
    dst_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (dst_dir / "chat.jsonl.part").symlink_to(victim)
    LocalTransport().put_file(str(src), str(dst_dir / "chat.jsonl"))
    assert victim.read_text() == "precious\n"
    assert (dst_dir / "chat.jsonl").read_text() == "new data\n"


# ---------------------------------------------------------------- the SSH transport's node-side scripts

def _cmdlines() -> list[bytes]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                out.append(Path(f"/proc/{d}/cmdline").read_bytes())
            except OSError:
                continue
    return out


def test_ssh_job_gets_its_secret_by_a_private_file_never_argv_and_stops_by_mark(tmp_path):
    t = ShellHere(tmp_path)
    run_dir = tmp_path / ".qwen-tui" / "runs" / "r1"
    got = tmp_path / "got"
    argv = ["sh", "-c", f'printf %s "$HF_TOKEN" > {got}; exec sleep 60']
    pid = t.start_job(argv, env={"HF_TOKEN": SECRET}, cwd=str(tmp_path), log=str(run_dir / "node-0.log"),
                      rcfile=str(run_dir / "node-0.rc"), run_id="r1")
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (got.exists() and got.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got.read_text() == SECRET
        assert not any(SECRET.encode() in c for c in _cmdlines())
        assert not (run_dir / "node-0.rc.env").exists()  # sourced, then removed
        assert run_dir.stat().st_mode & 0o777 == 0o700
        start = t.proc_start(pid)
        ref = JobRef(pid, start, "r1")
        assert job_verdict(t, ref)[0] == "ours"
        assert job_verdict(t, JobRef(bystander.pid, t.proc_start(bystander.pid), "r1"))[0] == "refused"
        assert job_verdict(t, JobRef(pid, start + 1, "r2"))[0] == "refused"
        assert stop_job(t, ref, grace=3)
        assert job_verdict(t, ref)[0] == "gone"
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        stop_job(LocalTransport(), JobRef(pid, LocalTransport().proc_start(pid), "r1"), grace=1)


def test_ssh_env_file_is_never_written_through_a_planted_link(tmp_path):
    t = ShellHere(tmp_path)
    run_dir = tmp_path / "runs" / "r2"
    run_dir.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (run_dir / "node-0.rc.env").symlink_to(victim)
    pid = t.start_job(["true"], env={"HF_TOKEN": SECRET}, cwd=str(tmp_path), log=str(run_dir / "node-0.log"),
                      rcfile=str(run_dir / "node-0.rc"), run_id="r2")
    deadline = time.monotonic() + 10
    while not (run_dir / "node-0.rc").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (run_dir / "node-0.rc").read_text().strip() == "0"
    assert victim.read_text() == "precious\n"
    for f in ("node-0.log", "node-0.rc"):
        assert (run_dir / f).stat().st_mode & 0o777 == 0o600, f
    assert pid > 1
