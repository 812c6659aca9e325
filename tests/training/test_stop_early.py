"""A SIGTERM that comes while the worker still imports torch is noted, not raised (an exception inside a C
extension's import can leave the process to crash later), and raised at the first safe point, arm()."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from training.runtime.stop import StopRequested, StopSignal


def test_a_signal_before_arm_is_noted_and_raised_at_arm():
    stop = StopSignal()
    previous = stop.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered on return to the interpreter: nothing raised
        assert stop.requested and stop.signum == signal.SIGTERM and not stop.armed
        with pytest.raises(StopRequested, match="SIGTERM"):
            stop.arm()
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_armed_signal_raises_where_the_worker_is_and_a_second_one_is_ignored():
    stop = StopSignal()
    previous = stop.install()
    try:
        stop.arm()  # nothing came yet: no raise
        with pytest.raises(StopRequested):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes of this loop
                pass
        os.kill(os.getpid(), signal.SIGTERM)  # while unwinding: must not raise again
        assert stop.signum == signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_armed_signal_inside_an_import_waits_for_the_import_to_end(tmp_path, monkeypatch):
    # set-up imports the model's classes lazily (transformers' modeling modules, C extensions among them): a stop
    # raised inside such an import aborted the rank (SIGABRT through nanobind) with a torchrun traceback and no
    # stop line. The stop must come once the import is done, the module whole.
    (tmp_path / "slow_module_for_stop.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "deadline = time.monotonic() + 0.5\n"
        "while time.monotonic() < deadline:\n"  # bytecode runs here: an unguarded handler raises at once
        "    pass\n"
        "COMPLETE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    stop = StopSignal()
    previous = stop.install()
    try:
        stop.arm()
        with pytest.raises(StopRequested, match="SIGTERM"):
            import slow_module_for_stop  # noqa: F401
            deadline = time.monotonic() + 5  # the stop comes within a retry of the import's end
            while time.monotonic() < deadline:
                pass
        mod = sys.modules.get("slow_module_for_stop")
        assert mod is not None and getattr(mod, "COMPLETE", False), "the stop broke into the import"
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.modules.pop("slow_module_for_stop", None)
