"""Command-line habits users bring from other tools: a closed pipe, any-case names, -v, shell completion."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from support.paths import ROOT

ZERO2 = str(ROOT / "presets" / "qwen2.5-7b-lora-2node-zero2.yaml")


def qwen_tui(*argv, cwd=ROOT, env_extra=None, timeout=120, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "qwen_tui", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, **kw)


def test_estimate_json_into_a_closed_pipe_ends_without_a_traceback():
    """`qwen-tui estimate --json | head`: the reader is gone before qwen-tui writes a byte."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "qwen_tui", "estimate", ZERO2, "--json"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # as `head` does once it has its lines
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141, err  # 128 + SIGPIPE, as a shell reports for a tool stopped by the pipe
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_gpu_name_in_any_case():
    lower = qwen_tui("estimate", ZERO2, "--json", "--gpu", "h100")
    assert lower.returncode == 0, lower.stderr
    assert json.loads(lower.stdout)["gpu"]["name"] == "H100"
    mixed = qwen_tui("estimate", ZERO2, "--json", "--gpu", "a100-80g")
    assert json.loads(mixed.stdout)["gpu"]["name"] == "A100-80G"
    bad = qwen_tui("estimate", ZERO2, "--gpu", "h1000")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr and "H100" in bad.stderr


def _ssh_banner_server() -> tuple[int, threading.Thread]:
    """A TCP server that answers one connection with an SSH banner and hangs up: enough for paramiko to log."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(60)

    def serve():
        try:
            conn, _ = srv.accept()
            with conn:
                conn.sendall(b"SSH-2.0-qwen-tui-test\r\n")
                conn.settimeout(5)
                try:
                    conn.recv(4096)
                except OSError:
                    pass  # the client's key exchange, or nothing: either way the server hangs up now
        finally:
            srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv.getsockname()[1], t


def test_verbose_twice_shows_paramikos_debug(tmp_path):
    port, server = _ssh_banner_server()
    preset = tmp_path / "one-remote.yaml"
    preset.write_text(
        "version: 1\nname: one-remote\ncluster:\n"
        "  nodes:\n  - {host: fakenode, user: nobody}\n"
        f"  known_hosts: {tmp_path / 'known_hosts'}\n  ssh_config: {tmp_path / 'ssh_config'}\n"
        "  connect_timeout: 10\n"
        "training:\n  model: builtin:tiny\n  data: builtin:demo-chat\n")
    (tmp_path / "ssh_config").write_text(f"Host fakenode\n  HostName 127.0.0.1\n  Port {port}\n")  # not local
    res = qwen_tui("-vv", "replay", str(preset), "--skip-checks", cwd=tmp_path,
                   env_extra={"QWEN_TUI_RUNS": str(tmp_path / "runs")})
    server.join(timeout=30)
    assert res.returncode != 0  # the fake server never lets it log in
    assert "DEBUG paramiko.transport" in res.stderr, res.stderr[-3000:]
    quiet = qwen_tui("show", str(preset), cwd=tmp_path)
    assert quiet.returncode == 0 and "paramiko" not in quiet.stderr and "INFO" not in quiet.stderr


@pytest.mark.slow
def test_verbose_run_writes_its_log_into_the_run_directory(tmp_path):
    runs = tmp_path / "runs"
    res = qwen_tui("replay", str(ROOT / "presets" / "local-demo.yaml"), "-v", "--max-seconds", "3", cwd=tmp_path,
                   env_extra={"QWEN_TUI_RUNS": str(runs)}, timeout=300)
    (run_dir,) = runs.iterdir()
    log = (run_dir / "qwen-tui.log").read_text()
    assert f"logging to {run_dir / 'qwen-tui.log'}" in log, (log, res.stderr[-2000:])
    assert "INFO" in res.stderr  # and on stderr
    quiet_runs = tmp_path / "quiet"
    # the same output directory as the first run: whatever that one left there is this one's to overwrite
    qwen_tui("replay", str(ROOT / "presets" / "local-demo.yaml"), "--max-seconds", "1", "--overwrite-output",
             cwd=tmp_path, env_extra={"QWEN_TUI_RUNS": str(quiet_runs)}, timeout=300)
    (quiet_dir,) = quiet_runs.iterdir()
    assert not (quiet_dir / "qwen-tui.log").exists()  # no -v, no log


def test_bash_completion_completes_commands_and_options():
    script = qwen_tui("completion", "bash")
    assert script.returncode == 0, script.stderr
    probe = script.stdout + """
COMP_WORDS=(qwen-tui e); COMP_CWORD=1; COMP_LINE="qwen-tui e"; COMP_POINT=${#COMP_LINE}
_shtab_qwen_tui; echo "commands: ${COMPREPLY[*]}"
COMP_WORDS=(qwen-tui estimate x.yaml --gp); COMP_CWORD=3; COMP_LINE="qwen-tui estimate x.yaml --gp"
COMP_POINT=${#COMP_LINE}; _shtab_qwen_tui; echo "options: ${COMPREPLY[*]}"
"""
    res = subprocess.run(["bash", "--norc", "-c", probe], capture_output=True, text=True, timeout=30)
    assert "commands: export estimate\n" in res.stdout, res.stdout + res.stderr
    assert "options: --gpu --gpu-memory-gib" in res.stdout, res.stdout + res.stderr


def test_zsh_completion_script():
    script = qwen_tui("completion", "zsh")
    assert script.returncode == 0 and script.stdout.startswith("#compdef qwen-tui"), script.stderr
    assert "estimate" in script.stdout and "--gpu" in script.stdout and "*.y(a|)ml" in script.stdout
    if shutil.which("zsh"):
        res = subprocess.run(["zsh", "-n", "-c", script.stdout], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
