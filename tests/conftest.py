"""Session-wide test settings shared by every test package.

- One cache for the tiny model (`builtin:tiny`) and DeepSpeed's compiled CPU ops,
  so the whole session builds each once; one tiny model directory (`tiny_model`) for
  every test that reads one.
- In CI (CI=true) a skipped test fails the run: tests that need root, sshd or
  network namespaces must run there, not quietly skip.
"""

import os
import tempfile
from pathlib import Path

import pytest

_CACHE = Path(os.environ.get("QWEN_TUI_TEST_CACHE") or Path(tempfile.gettempdir()) / "qwen-tui-test-cache")
os.environ.setdefault("QWEN_TUI_CACHE", str(_CACHE / "models"))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(_CACHE / "torch_extensions"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny Qwen2 model and tokenizer, built once per test session for every folder (read it, never change it:
    copy it first)."""
    from training.model.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny") / "tiny-qwen2")
