"""A SIGTERM that comes while the worker still imports torch is noted, not raised (an exception inside a C
extension's import can leave the process to crash later), and raised at the first safe point, arm()."""

from __future__ import annotations

import os
import signal

import pytest

from training.stop import StopRequested, StopSignal


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
