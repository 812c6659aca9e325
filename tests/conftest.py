"""Session-wide test settings shared by every test package.

- One cache for the tiny model (`builtin:tiny`) and DeepSpeed's compiled CPU ops,
  so the whole session builds each once; one tiny model directory (`tiny_model`) for
  every test that reads one.
- In CI (CI=true) a skipped test fails the run: tests that need root, sshd or
  network namespaces must run there, not quietly skip.
- The suite runs on three pytest-xdist workers (README's command). Tests that hold
  one thing of this machine run on one worker, one after another: the namespace
  cluster (its node names, addresses and iptables rules are fixed), and the
  shipped demo preset (its master port 29533, its output and runs directories
  in the checkout, the port checks that expect that port free), and the tests
  that drive tmux (one tmux server per user).
"""

import os
import re
import tempfile
from functools import cache
from pathlib import Path

import pytest

_CACHE = Path(os.environ.get("QWEN_TUI_TEST_CACHE") or Path(tempfile.gettempdir()) / "qwen-tui-test-cache")
os.environ.setdefault("QWEN_TUI_CACHE", str(_CACHE / "models"))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(_CACHE / "torch_extensions"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # The workers share the cores: one thread a process (this one and what it starts), not one each per core.
    os.environ["OMP_NUM_THREADS"] = "1"

_skipped: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("CI") and _skipped and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if os.environ.get("CI") and _skipped:
        terminalreporter.write_line(
            f"CI: {len(_skipped)} test(s) skipped; in CI every test must run: " + ", ".join(_skipped[:10]), red=True)


_TESTS = Path(__file__).parent
# A test module that names the demo preset as shipped (not a copy on a free port: support.demo_run, demo_copy),
# or drives a real terminal: tmux's one server per user exits with its last session, and a new-session racing
# that exit fails. Such modules take turns.
_TAKES_TURNS = re.compile(r"\bDEMO\b|local-demo|support\.tmux")


@cache
def _takes_turns(path: str) -> bool:
    return bool(_TAKES_TURNS.search(Path(path).read_text(encoding="utf-8")))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups off the items
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if path.is_relative_to(_TESTS / "cluster"):
            item.add_marker(pytest.mark.xdist_group("cluster"))
        elif _takes_turns(str(path)):
            item.add_marker(pytest.mark.xdist_group("demo-and-terminal"))
        elif path.is_relative_to(_TESTS / "training"):
            # a worker module's tests on one worker: its module-scoped runs (the reference curves, the shared
            # models) are trained once, not once on each worker its tests were spread over
            item.add_marker(pytest.mark.xdist_group(f"module-{path.stem}"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny Qwen2 model and tokenizer, built once per test session for every folder (read it, never change it:
    copy it first)."""
    from training.model.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny") / "tiny-qwen2")
