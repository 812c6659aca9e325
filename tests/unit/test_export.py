"""Exports: every format passes `bash -n` and runs the plan's own command."""

import shlex
import subprocess
import sys

import pytest

from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.files import load_preset
from qwen_tui.run.export.render import ENGINES, FORMATS, render
from support.paths import ROOT

PRESETS = sorted((ROOT / "presets").glob("*.yaml"))


def plan_for(path):
    return make_plan(load_preset(path), run_id="exp", local_run_dir="/tmp/runs/exp", base_dir="/home/u")


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f not in ENGINES])  # the engines' YAML: test_export_engines.py
@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_every_format_is_valid_bash(fmt, path, tmp_path):
    files = render(plan_for(path), fmt)
    assert files
    for name, text in files.items():
        f = tmp_path / name
        f.write_text(text)
        res = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, timeout=10)
        assert res.returncode == 0, f"{name}: {res.stderr}"


def test_slurm_script_asks_for_the_plan_resources():
    plan = plan_for(ROOT / "presets/qwen2.5-14b-full-4node-zero3.yaml")
    text = next(iter(render(plan, "slurm").values()))
    assert "#SBATCH --nodes=4" in text and "#SBATCH --gpus-per-node=8" in text
    assert "srun" in text and '--node_rank "$SLURM_NODEID"' in text and "torch.distributed.run" in text
    assert "--deepspeed builtin:zero3" in text


def test_pbs_script_select_line():
    plan = plan_for(ROOT / "presets/qwen2.5-72b-qlora-4x1gpu.yaml")
    text = next(iter(render(plan, "pbs").values()))
    assert "#PBS -l select=4:ngpus=1" in text and "--q_lora" in text


def test_sh_exports_one_script_per_node_with_exact_argv():
    plan = plan_for(ROOT / "presets/qwen2.5-7b-lora-2node-zero2.yaml")
    files = render(plan, "sh")
    assert sorted(files) == ["node-0.sh", "node-1.sh"]
    for c in plan.nodes:
        text = files[f"node-{c.rank}.sh"]
        exec_line = next(ln for ln in text.splitlines() if ln.startswith("exec "))
        assert shlex.split(exec_line)[1:] == c.argv
        assert f"export NODE_RANK={c.rank}" in text


def test_sh_script_really_runs_the_command(tmp_path):
    """Run an exported script with a fake python that prints its argv: same argv as the plan."""
    fake = tmp_path / "fakepy"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\necho "NODE_RANK=$NODE_RANK"\n')
    fake.chmod(0o755)
    pr = load_preset(ROOT / "presets/local-demo.yaml")
    pr = pr.model_copy(update={"cluster": pr.cluster.model_copy(update={"nodes": [
        n.model_copy(update={"python": str(fake), "workdir": str(tmp_path)}) for n in pr.cluster.nodes]})})
    plan = make_plan(pr, run_id="x", local_run_dir=str(tmp_path / "runs"))
    files = render(plan, "sh")
    s = tmp_path / "node-1.sh"
    s.write_text(files["node-1.sh"])
    res = subprocess.run(["bash", str(s)], capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == plan.nodes[1].argv[1:] + ["NODE_RANK=1"]


def test_export_cli_writes_files(tmp_path):
    out = tmp_path / "scripts"
    res = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "export", str(PRESETS[0]), "--format", "sh",
                          "-o", str(out)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert len(list(out.glob("node-*.sh"))) >= 2
    res = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "export", str(PRESETS[0]), "--format", "slurm"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.startswith("#!/usr/bin/env bash\n#SBATCH")


def test_export_bad_preset_exits_2_naming_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "presets/local-demo.yaml").read_text().replace("method: lora", "method: lorra"))
    res = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "export", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "training.method" in res.stderr and f"{bad}:" in res.stderr
