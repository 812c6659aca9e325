"""The shell scripts that start, find and stop a job (qwen_tui/nodes/remote/in_dir.sh, job.sh, detach.sh,
job_procs.sh, job_pids.sh, kill_checked.sh), run with sh here as SSHTransport runs them on a node: the text
as `sh -c`'s script, everything it works on as its arguments. What they print is read back with the
transport's own parsers (qwen_tui.nodes.jobs)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from qwen_tui.nodes.jobs import JOB_MARK, RUN_MARK, JobRef, Proc, env_script, job_argv, members, parse_marks, parse_stat
from qwen_tui.nodes.programs import program


def sh(name: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", program(name), "sh", *args], capture_output=True, text=True,
                          timeout=kw.pop("timeout", 30), **kw)


def wait_for(pred, bound: float = 10.0):
    end = time.monotonic() + bound
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"not within {bound}s")


def alive(pid: int) -> bool:
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())[0] != "Z"
    except OSError:  # gone
        return False


def procs_of(pgid: int, run_id: str) -> list[Proc]:
    """job_procs.sh's lines as SSHTransport.job_procs reads them."""
    r = sh("job_procs.sh", str(pgid), run_id)
    assert r.returncode == 0, r.stderr
    out = []
    for line in r.stdout.splitlines():
        pid, _, rest = line.partition("\t")
        st, _, marks = rest.rpartition("\t")
        parsed = parse_stat(st)
        assert pid.isdigit() and parsed is not None, line
        out.append(Proc(int(pid), parsed[1], parsed[2], parsed[0], parse_marks("\0".join(marks.split()).encode())))
    return out


def test_in_dir_runs_argv_there_and_a_missing_dir_is_96(tmp_path):
    odd = tmp_path / "a dir; with $(odd) name"
    odd.mkdir()
    r = sh("in_dir.sh", str(odd), "sh", "-c", 'pwd; printf "%s|" "$@"', "x", "one arg", "$HOME")
    assert r.returncode == 0 and r.stdout == f"{odd}\none arg|$HOME|"
    assert sh("in_dir.sh", str(tmp_path / "nope"), "true").returncode == 96


def test_a_job_logs_its_output_writes_its_exit_code_and_carries_both_marks(tmp_path):
    log, rc = tmp_path / "logs" / "node.log", tmp_path / "rc" / "node.rc"
    log.parent.mkdir()
    rc.parent.mkdir()
    envf = tmp_path / "job.env"
    envf.write_bytes(env_script({"SECRET": "it's $x"}))
    argv = job_argv(["sh", "-c", f'echo "out $SECRET"; echo err >&2; echo "$$ ${JOB_MARK} ${RUN_MARK}"; exit 7'],
                    str(tmp_path), str(log), str(rc), envfile=str(envf), run_id="run-1")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == ""  # the command's exit code goes to the file, not to the caller
    text = log.read_text().splitlines()
    assert text[:2] == ["out it's $x", "err"]
    shell_pid, job_mark, run_mark = text[2].split()
    assert run_mark == "run-1" and int(job_mark) != int(shell_pid)  # the leader's pid: the command is its child
    assert rc.read_text() == "7\n" and not envf.exists() and not Path(f"{rc}.tmp").exists()
    for f in (log, rc):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600


@pytest.mark.parametrize("case, code", [("no cwd", 97), ("no env file", 96)])
def test_a_job_that_cannot_start_says_why_in_its_log_and_exit_code(tmp_path, case, code):
    log, rc = tmp_path / "node.log", tmp_path / "node.rc"
    cwd = str(tmp_path / "absent") if case == "no cwd" else str(tmp_path)
    envf = str(tmp_path / "absent.env") if case == "no env file" else ""
    r = subprocess.run(job_argv(["touch", str(tmp_path / "ran")], cwd, str(log), str(rc), envfile=envf, run_id="r"),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == code and rc.read_text() == f"{code}\n" and not (tmp_path / "ran").exists()
    assert ("cannot cd to" if code == 97 else "cannot read the job environment") in log.read_text()


def test_a_detached_job_is_found_by_group_and_mark_and_stopped_only_when_its_start_time_matches(tmp_path):
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    logs, rcs = tmp_path / "logs", tmp_path / "rc"
    envf = str(logs / "job.env")
    # the job: a shell that starts a rank in a session of its own (as torchrun does), then waits
    inner = job_argv(["sh", "-c", f"setsid sleep 60 & echo $! > {tmp_path / 'rank.pid'}; echo \"$GREETING\"; wait"],
                     str(tmp_path), str(logs / "n.log"), str(rcs / "n.rc"), envfile=envf, run_id=run_id)
    r = sh("detach.sh", str(logs), str(rcs), envf, run_id, *inner, input="export GREETING='hi there'\n")
    assert r.returncode == 0, r.stderr
    pid, rank = int(r.stdout.strip()), None
    try:
        assert stat.S_IMODE(logs.stat().st_mode) == 0o700 and stat.S_IMODE(rcs.stat().st_mode) == 0o700
        rank = int(wait_for(lambda: (tmp_path / "rank.pid").exists() and (tmp_path / "rank.pid").read_text().strip()))
        assert wait_for(lambda: "hi there" in (logs / "n.log").read_text()) and not os.path.exists(envf)
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid and os.getsid(rank) == rank != pid

        procs = procs_of(pid, run_id)
        byid = {p.pid: p for p in procs}
        # the leader's environment is the one it was exec'd with: the run mark (its own export comes after)
        assert byid[pid].marks == {RUN_MARK: run_id} and byid[pid].pgrp == pid
        assert byid[rank].marks == {JOB_MARK: str(pid), RUN_MARK: run_id}  # found by mark: another session
        start = byid[pid].start
        assert {p.pid for p in members(JobRef(pid, start, run_id), procs)} >= {pid, rank}
        assert procs_of(pid, "another-run")[0].pid == pid and rank not in {p.pid for p in procs_of(pid, "x")}

        pids = sh("job_pids.sh", str(pid))
        assert {pid, rank} <= {int(x) for x in pids.stdout.split()}

        # a wrong start time (a reused pid) is never signalled
        wrong = sh("kill_checked.sh", "TERM", f"{rank}:{byid[rank].start + 1}")
        assert wrong.stdout.strip() == "0" and alive(rank)
        (cmd,) = [p for p in procs if p.pgrp == pid and p.pid != pid]  # the command, the leader's child
        right = sh("kill_checked.sh", "TERM", f"{cmd.pid}:{cmd.start}", f"{rank}:{byid[rank].start}", "999999999:1")
        assert right.stdout.strip() == "2"
        # the leader outlives its command and writes the exit code (143: ended by SIGTERM)
        assert wait_for(lambda: rcs.joinpath("n.rc").exists() and rcs.joinpath("n.rc").read_text()) == "143\n"
        wait_for(lambda: not alive(rank))
        assert sh("job_pids.sh", str(pid)).stdout.split() == []
    finally:
        for p in (pid, rank):
            if p:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
