"""A new user's first commands, run as they would run them (subprocess): `show` prints every default, `runs`
fits a narrow terminal without cutting the run id, `chat`/`merge` take `last` and run ids as `attach` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from qwen_tui.preset.schema import Preset
from support.paths import DEMO, ROOT
from support.runs import fake_run


def qwen_tui(*argv, cwd=ROOT, columns=200, env_extra=None, timeout=120, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "qwen_tui", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, **kw)


def _leaves(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out |= _leaves(v, f"{prefix}{k}.")
        else:
            out.add(prefix + k)
    return out


def test_show_prints_every_default_and_reads_back_as_the_same_preset(tmp_path):
    res = qwen_tui("show", str(DEMO))
    assert res.returncode == 0, res.stderr
    shown = yaml.safe_load(res.stdout)
    every = Preset.model_json_schema()
    # every field of every section is there, the defaults the demo never writes included
    for section in ("cluster", "network", "training"):
        ref = every["properties"][section].get("$ref", "").rsplit("/", 1)[-1]
        fields = set(every["$defs"][ref]["properties"])
        assert fields <= set(shown[section]), (section, fields - set(shown[section]))
    assert shown["training"]["save_total_limit"] == 2 and shown["training"]["seed"] == 42  # defaults, unwritten
    assert shown["cluster"]["nodes"][0]["port"] == 22
    again = tmp_path / "shown.yaml"
    again.write_text(res.stdout)
    from qwen_tui.preset.files import load_preset

    assert load_preset(again).model_dump() == load_preset(DEMO).model_dump()


def test_runs_fits_80_and_50_columns_and_never_cuts_the_run_id(tmp_path):
    root = tmp_path / "runs"
    ids = ["20261202-090724-a-rather-long-preset-name-5960", "20261202-091500-local-demo-6001"]
    fake_run(root, ids[0], 1000.0, losses=[2.5, 2.0])
    fake_run(root, ids[1], 2000.0, status="running", losses=[3.0])
    for cols in (80, 50):
        res = qwen_tui("runs", "--runs-dir", str(root), columns=cols)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        assert all(len(ln.rstrip()) <= cols for ln in lines), res.stdout  # the table, its title and the note
        for rid in ids:
            assert any(rid in ln for ln in lines), (rid, res.stdout)  # whole, on one line
        assert "--json" in res.stdout  # says what was left out and where to see it
    wide = qwen_tui("runs", "--runs-dir", str(root), columns=200)
    assert "left out" not in wide.stdout and "2: gpu-1, gpu-2" in wide.stdout


def running_demo_run(root: Path, rid: str) -> Path:
    """The run directory of a demo run that is still training, as the launcher writes it (nothing launched)."""
    from qwen_tui.preset.files import load_preset, save_preset
    from qwen_tui.run import api
    from qwen_tui.run.rundir import RunDir

    preset = load_preset(DEMO)
    rd = RunDir.create(root, rid)
    rd.write_plan(api.plan(preset, run_id=rid, root=root, base_dir=str(root), local_python=sys.executable))
    save_preset(preset, rd.path / "preset.yaml")
    rd.write_state(status="running", started=2000.0)
    return rd.path


def test_chat_and_merge_take_last_and_run_ids_as_attach_does(tmp_path):
    root = tmp_path / "runs"
    rid = "20261202-091500-local-demo-6001"
    running_demo_run(root, rid)
    for cmd in ("chat", "merge"):
        for ref in ("last", rid, rid[:12]):
            res = qwen_tui(cmd, ref, "--runs-dir", str(root), *(["--prompt", "hi"] if cmd == "chat" else []))
            # found: the run itself answers (it has not finished), not "no such directory"
            assert res.returncode == 1 and "has not finished yet" in res.stderr, (cmd, ref, res.stderr)
            assert str(root / rid) in res.stderr
        res = qwen_tui(cmd, "nothing-like-it", "--runs-dir", str(root), *(["--prompt", "hi"] if cmd == "chat" else []))
        assert res.returncode == 2 and "no run 'nothing-like-it'" in res.stderr, res.stderr


def test_keys_on_an_all_local_preset_makes_no_key_and_says_there_is_nothing_to_do(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    res = qwen_tui("keys", str(DEMO), env_extra={"HOME": str(home)}, input="")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "nothing to do" in res.stdout and "password" not in (res.stdout + res.stderr).lower()
    assert not (home / ".ssh").exists(), list(home.rglob("*"))  # no key pair made without asking


def test_export_of_a_cpu_preset_asks_the_scheduler_for_no_gpus(tmp_path):
    slurm = qwen_tui("export", str(DEMO), "--format", "slurm", cwd=tmp_path)
    assert slurm.returncode == 0, slurm.stderr
    assert "--gpus-per-node" not in slurm.stdout and "#SBATCH --cpus-per-task=" in slurm.stdout
    pbs = qwen_tui("export", str(DEMO), "--format", "pbs", cwd=tmp_path)
    assert pbs.returncode == 0, pbs.stderr
    assert "ngpus" not in pbs.stdout and "ncpus=" in pbs.stdout
    gpu = qwen_tui("export", str(ROOT / "presets" / "qwen2.5-7b-lora-2node-zero2.yaml"), "--format", "slurm",
                   cwd=tmp_path)
    assert "#SBATCH --gpus-per-node=8" in gpu.stdout  # a GPU preset still asks for its GPUs
