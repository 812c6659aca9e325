"""The demo run that several launch tests read, trained once per session (a replay of the demo costs tens of
seconds on two cores)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.demo_run import EVAL_STEPS, demo_run


@pytest.fixture(scope="session")
def demo_eval_run(tmp_path_factory) -> Path:
    """The demo preset with eval_data and eval_steps added, replayed once: its run directory."""
    return demo_run(tmp_path_factory.mktemp("demo"), eval_data="builtin:demo-chat", eval_steps=EVAL_STEPS)
