"""Waits for the app driven by Textual's Pilot, and the terminal size the Run-screen tests use."""

from __future__ import annotations

import time

SIZE = (140, 44)


async def wait_until(pilot, pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        await pilot.pause(0.25)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
