"""The node-side programs as a whole (qwen_tui/nodes/remote/, read by qwen_tui.nodes.programs): every file is
sent by some caller, each caller sends what program() assembles, every Python program compiles and needs only
the standard library of the node's python3 (what they import to ask the node about its training stack aside),
every shell script parses and comes out as one line, and the wheel ships them. Each program's behaviour has its own tests (test_remote_*.py)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
import tomllib

from qwen_tui.nodes import hubmodel, jobs, keys, sync
from qwen_tui.nodes.checks import netcheck, probe, rehearsal, storage
from qwen_tui.nodes.programs import PARTS, REMOTE, body, program
from qwen_tui.nodes.slurm import agent_link
from qwen_tui.nodes.transport import node_commands, ssh
from qwen_tui.run.recovery import restarts
from qwen_tui.run.watch import evidence, gpumon, gpuseries, watchdog
from support.paths import ROOT

PKG = ROOT / "qwen_tui"
FILES = sorted(p.name for p in REMOTE.iterdir() if p.name.endswith((".py", ".sh")))
PY = [n for n in FILES if n.endswith(".py")]
SH = [n for n in FILES if n.endswith(".sh")]
SENT = sorted(set(PARTS) | {n for n in FILES if n not in {p for parts in PARTS.values() for p in parts}})


def named_in_code() -> set[str]:
    """Every literal name passed to program(...) in qwen_tui's modules."""
    out = set()
    for f in PKG.rglob("*.py"):
        if "remote" in f.relative_to(PKG).parts:
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "program" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                out.add(node.args[0].value)
    return out


def test_every_file_is_sent_by_a_caller_and_nothing_else_is_asked_for():
    assert len(FILES) == 24 and not (PKG / "nodes" / "remote" / "__init__.py").exists()
    named = named_in_code()
    assert named - set(FILES) == set()  # a name without its file would fail at import
    parts = {p for ps in PARTS.values() for p in ps}
    assert set(FILES) - named - parts == set()


def test_the_callers_send_what_program_assembles():
    sent = {
        probe.SNIPPET: "probe.py", sync.MANIFEST: "manifest.py", netcheck.LISTEN: "port_listen.py",
        netcheck.CONNECT: "port_connect.py", hubmodel.DOWNLOAD: "hub_download.py", gpumon.CPU_LOOP: "cpu_sampler.py",
        rehearsal.SNIPPET: "rehearsal.py", ssh._IN_DIR: "in_dir.sh", ssh._DETACH: "detach.sh",
        node_commands._JOB_PROCS: "job_procs.sh", node_commands._KILL_CHECKED: "kill_checked.sh",
        node_commands._JOB_PIDS: "job_pids.sh", agent_link.AGENT: "agent.py",
        jobs.JOB_SCRIPT: "job.sh", keys._APPEND_ONCE: "append_once.sh", keys._NODE_KEY: "node_key.sh",
        keys._KEY_AUTHORIZED: "key_authorized.sh", storage._WRITE: "write_marker.sh",
        watchdog.READ_BEATS: "read_beats.sh", evidence._PROBE: "slow_node_evidence.sh",
        restarts._LIST_CHECKPOINTS: "list_checkpoints.sh", gpuseries.APPEND_PRIVATE: "append_private.sh",
    }
    assert sorted(sent.values()) == SENT
    for text, name in sent.items():
        assert text == program(name), name
    # the parts in their order, each without its header: what the node runs defines before it calls
    assert probe.SNIPPET == body("ib_sysfs.py") + body("digests.py") + body("probe.py")
    assert probe.SNIPPET.index("def read_sysfs(") < probe.SNIPPET.index("def sha_file(") \
        < probe.SNIPPET.index("read_sysfs(ib)") < probe.SNIPPET.index("sha_file(q)")


@pytest.mark.parametrize("name", PY)
def test_python_programs_compile_and_need_only_the_standard_library(name):
    text = program(name)
    tree = ast.parse(text)
    compile(text, name, "exec")
    assert REMOTE.joinpath(name).read_text().splitlines()[0] not in text  # the header stays home
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            mods.add(node.module.split(".")[0])
    # the rehearsal runs in the training environment; the probe reports what the node's torch and training code
    # say when imported, the download exits 3 without huggingface_hub: each an answer, not a crash
    allowed = {"rehearsal.py": {"torch"}, "probe.py": {"torch", "training"},
               "hub_download.py": {"huggingface_hub"}}.get(name, set())
    assert mods - set(sys.stdlib_module_names) - allowed == set(), name


@pytest.mark.parametrize("name", SH)
def test_shell_scripts_parse_as_files_and_as_the_one_line_sent(name):
    text = program(name)
    assert "\n" not in text and text == text.strip()
    lines = body(name).splitlines()
    assert lines and not any(ln.lstrip().startswith("#") for ln in lines), "a comment would swallow the joined line"
    for script in (str(REMOTE.joinpath(name)), None):
        argv = ["sh", "-n", script] if script else ["sh", "-n", "-c", text]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        assert r.returncode == 0, (name, r.stderr)


def test_the_scripts_use_the_marks_the_python_side_reads():
    assert (jobs.JOB_MARK, jobs.RUN_MARK) == ("QWEN_TUI_JOB_PGID", "QWEN_TUI_RUN_ID")
    assert f"export {jobs.JOB_MARK}=$$;" in program("job.sh")
    assert f"export {jobs.RUN_MARK}=$4;" in program("detach.sh")
    assert f'"{jobs.RUN_MARK}=$run"' in program("job_procs.sh") and f"({'|'.join(jobs.READ_MARKS)})=" in \
        program("job_procs.sh")
    from training.runtime.stop import STOP_MARK  # the waiter's exec sets it, the stop reads it
    assert STOP_MARK == jobs.STOP_MARK in jobs.READ_MARKS
    assert f'"{jobs.JOB_MARK}=$pg"' in program("job_pids.sh")
    assert gpumon.CPU_LOOP_MARK in program("cpu_sampler.py").splitlines()[1]


def test_an_unknown_kind_of_file_is_refused():
    with pytest.raises(ValueError, match="not a node program"):
        program("notes.txt")


def test_the_wheel_ships_them():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["qwen_tui"]
    assert {"nodes/remote/*.py", "nodes/remote/*.sh"} <= set(data)
