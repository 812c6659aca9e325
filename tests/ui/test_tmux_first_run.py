"""A new user's first run, in a real terminal, with the keyboard only: the installed
`qwen-tui` started on a preset file that does not exist yet goes through every step
(Nodes probe, SSH, Network port, Training form, Review) to a finished local run with its
loss on screen, then launches a second run from the same Run screen and sees that one
start and finish too (the second launch once hung at "starting"). ctrl+s then writes
the new preset where the command line named it."""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
import uuid
from pathlib import Path

import pytest

from qwen_tui.preset.files import load_preset
from support.paths import ROOT
from support.ports import free_port
from support.tmux import end_session, keys, screen, stop_leftovers, tmux, type_into, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RUN_WAIT_S = 120.0  # one tiny CPU run: about 35 s on an idle 2-core machine, three times that under load


def choose(session: str, options: tuple[str, ...], moves: tuple[str, ...], picked: str) -> None:
    """Open the focused Select (Enter), wait until its options are on screen, move and pick, then wait until
    it shows `picked` closed: keys sent before the overlay opens would land on the closed select (under
    load that once left the device at "GPU (cuda)")."""
    keys(session, "Enter")
    wait_for(session, *options)
    keys(session, *moves, "Enter")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        s = screen(session)
        if picked in s and not all(o in s for o in options):
            return
        time.sleep(0.2)
    raise AssertionError(f"the select did not close on {picked!r}:\n{screen(session)}")


def run_dir_on_screen(session: str, runs: Path, timeout: float) -> str:
    """The run id of the run the Run screen shows (its header names the run directory)."""
    s = wait_for(session, f"run dir {runs}/", timeout=timeout)
    m = re.search(re.escape(f"run dir {runs}/") + r"(\S+)", s)
    assert m, s
    return m.group(1)


def test_new_preset_to_two_finished_runs(tmp_path):
    session = f"qt-{uuid.uuid4().hex[:8]}"
    exe = Path(sys.executable).with_name("qwen-tui")
    runs, out, preset = tmp_path / "runs", tmp_path / "out", tmp_path / "my-first.yaml"
    port = free_port()
    env = f"PYTHONPATH={shlex.quote(str(ROOT))} QWEN_TUI_RUNS={shlex.quote(str(runs))}"
    # stty: the pty's size for the app from its first frame (a detached tmux may start it at 80x24)
    # COLUMNS/LINES (pytest exports them) would override the size the app reads (shutil's rule)
    cmd = (f"unset COLUMNS LINES; stty cols 160 rows 48; "
           f"cd {shlex.quote(str(ROOT))} && {env} {shlex.quote(str(exe))} {shlex.quote(str(preset))}; "
           "echo EXITED=$?; sleep 60")
    tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "48", cmd)
    t0 = time.monotonic()
    try:
        # a path that names no file is a new preset, not an error
        s = wait_for(session, "does not exist yet", "Nodes: the machines of this run", timeout=30)
        assert "could not be opened" not in s
        assert "my-first" in s.splitlines()[0]  # named after its file

        # 1 Nodes: probe this machine
        keys(session, "p")
        wait_for(session, "✔ probed", timeout=60)

        # 2 SSH: one local node needs none
        keys(session, "F2")
        wait_for(session, "Every node is this machine")

        # 3 Network: a free master port (the focus starts on the table; the port is four fields back)
        keys(session, "F3")
        wait_for(session, "Network: workers reach the master")
        keys(session, "BTab", "BTab", "BTab", "BTab")
        type_into(session, str(port))
        wait_for(session, str(port))

        # 4 Training: the first field has focus; Tab walks the form. Selects open with Enter.
        keys(session, "F4")
        wait_for(session, "model (hub id or path)", "builtin:tiny")
        keys(session, *["Tab"] * _tabs("training.model", "training.zero_stage"))  # -> ZeRO stage
        choose(session, ("none (DDP)", "ZeRO-2", "ZeRO-3"), ("Up",), "none (DDP)")  # ZeRO-2 -> none (DDP)
        keys(session, "Tab")
        choose(session, ("bf16", "fp16", "fp32"), ("Down", "Down"), "fp32")  # precision bf16 -> fp32
        keys(session, *["Tab"] * _tabs("training.precision", "training.device"))  # FP8 stays auto; -> device
        choose(session, ("auto", "GPU (cuda)", "CPU"), ("Down", "Down"), "CPU")  # device auto -> CPU
        keys(session, *["Tab"] * _tabs("training.device", "training.model_max_length"))  # GPU type stays
        type_into(session, "128")
        keys(session, "Tab", "Tab")  # GPUs a sequence spans stays; -> batch per GPU
        type_into(session, "4")  # batch per GPU
        keys(session, "Tab")
        type_into(session, "1")  # accumulation
        keys(session, "Tab", "Tab")  # gradient checkpointing stays; -> learning rate
        type_into(session, "0.002")
        keys(session, "Tab", "Tab")  # epochs stay; -> max steps
        type_into(session, "4")
        keys(session, "Tab")
        type_into(session, str(out))
        wait_for(session, "none (DDP)", "fp32", "CPU", "out")

        # 5 Review: the plan holds what was typed
        keys(session, "F5")
        s = wait_for(session, "Commands per node", "--max_steps 4")
        assert f"--master_port {port}" in s.replace("\n", " ") or str(port) in s
        # the path may wrap anywhere, the next line indented: compare without any whitespace (the path has none)
        assert "--use_cpu" in s and str(out) in "".join(s.split())

        # 6 Run: launch, follow to the end, the loss on screen
        keys(session, "l")
        first = run_dir_on_screen(session, runs, timeout=60)
        s = wait_for(session, "ok: training finished on every node", "step 4/4", timeout=RUN_WAIT_S)
        assert re.search(r"loss \d+\.\d+", s), s

        # a second launch from the same screen: it asks about the output dir, then shows the new run
        keys(session, "l")
        wait_for(session, "The output directory already holds a run", timeout=30)
        keys(session, "y")
        deadline = time.monotonic() + 60
        second = first
        while second == first and time.monotonic() < deadline:
            second = run_dir_on_screen(session, runs, timeout=60)
            time.sleep(0.5)
        assert second != first, "the Run screen still shows the first run after the second launch"
        s = wait_for(session, "ok: training finished on every node", "step 4/4", timeout=RUN_WAIT_S)
        assert "starting:" not in s
        assert re.search(r"loss \d+\.\d+", s), s
        assert {p.name for p in runs.iterdir()} == {first, second}
        for rid in (first, second):
            assert json.loads((runs / rid / "state.json").read_text())["status"] == "ok", rid

        # ctrl+s writes the new preset where the command line named it
        keys(session, "C-s")
        # bounded at 60 s: on a loaded machine the second run's last redraws come first; on a timeout the
        # screen says why
        deadline = time.monotonic() + 60
        while not preset.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert preset.exists(), f"ctrl+s wrote no preset in 60 s; the screen:\n{screen(session)}"
        saved = load_preset(preset)
        assert (saved.name, saved.training.max_steps, saved.network.master_port) == ("my-first", 4, port)
        assert saved.training.output_dir == str(out)

        keys(session, "C-q")
        wait_for(session, "EXITED=0", timeout=30)
        assert time.monotonic() - t0 < 280
    finally:
        end_session(session)
        stop_leftovers(runs)


def _tabs(start: str, to: str) -> int:
    """Tab presses from one field of the Training step to another, in the form's own order (the GPU type select
    follows the device's)."""
    from qwen_tui.ui.screens.training import FIELDS

    paths = [p for p, _, _ in FIELDS]
    a, b = paths.index(start), paths.index(to)
    return b - a + (a <= paths.index("training.device") < b)
