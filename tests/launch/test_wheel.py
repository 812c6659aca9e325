"""qwen-tui as users install it: a wheel built from this tree, installed (not editable) into a fresh venv.

The venv sees the test environment's site-packages through a .pth line, so nothing is downloaded; a .pth line
adds the directory without running its own .pth files, so the test environment's editable install of
qwen-tui stays out of the way and the wheel is what runs. Every command runs from an empty directory: no
checkout on sys.path, no ./presets to fall back on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from support.paths import ROOT

BUILD_INPUTS = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "constraints.txt", "qwen_tui", "training",
                "presets"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"  # a copy: building in the checkout would leave build/ and *.egg-info behind
    for name in BUILD_INPUTS:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(p, src / name)
    dist = base / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(src)], check=True, timeout=300, capture_output=True)
    (wheel,) = dist.glob("qwen_tui-*.whl")
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    (site / "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, timeout=300, capture_output=True)
    work = base / "elsewhere"
    work.mkdir()
    return {"wheel": wheel, "bin": env_dir / "bin", "py": py, "cwd": work, "site": site}


def run(installed, *argv, timeout=120):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{installed['bin']}{os.pathsep}{env.get('PATH', '')}"
    env["QWEN_TUI_RUNS"] = str(installed["cwd"] / "runs")
    return subprocess.run(list(argv), cwd=installed["cwd"], env=env, capture_output=True, text=True, timeout=timeout)


def test_wheel_ships_the_presets_and_one_version(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    shipped = {Path(n).name for n in names if n.startswith("qwen_tui/presets/")}
    assert shipped == {p.name for p in (ROOT / "presets").glob("*.yaml")}
    assert "training/ds_config_zero2.json" in names and "training/demo_data/demo_chat.jsonl" in names
    assert "qwen_tui/ui/app.tcss" in names
    from qwen_tui import __version__

    assert installed["wheel"].name.startswith(f"qwen_tui-{__version__}-")
    res = run(installed, "qwen-tui", "--version")
    assert res.returncode == 0 and res.stdout.strip() == f"qwen-tui {__version__}", res.stderr


def test_installed_package_is_the_wheel_not_the_checkout(installed):
    res = run(installed, str(installed["py"]), "-c",
              "import qwen_tui, training, qwen_tui.preset.shipped as p; print(qwen_tui.__file__); print(p.presets_dir())")
    assert res.returncode == 0, res.stderr
    module, presets = res.stdout.split()
    assert module.startswith(str(installed["site"])) and presets.startswith(str(installed["site"]))


def test_python_dash_m_qwen_tui_help(installed):
    res = run(installed, str(installed["py"]), "-m", "qwen_tui", "--help")
    assert res.returncode == 0 and "usage: qwen-tui" in res.stdout and "demo" in res.stdout, res.stderr


def test_installed_demo_plans_from_anywhere(installed):
    res = run(installed, "qwen-tui", "demo", "--dry-run")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "training.finetune" in res.stdout and "builtin:tiny" in res.stdout
    res = run(installed, "qwen-tui", "show", str(Path(installed["site"]) / "qwen_tui" / "presets" / "local-demo.yaml"))
    assert res.returncode == 0 and "name: local-demo" in res.stdout, res.stderr


def test_installed_worker_help(installed):
    res = run(installed, str(installed["py"]), "-m", "training.finetune", "--help")
    assert res.returncode == 0 and "--evaluation_strategy" in res.stdout, res.stderr


def demo(installed):
    import time

    for _ in range(6):  # the demo's fixed port may be taken for a moment by another test on a shared machine
        res = run(installed, "qwen-tui", "demo", "--max-seconds", "240", timeout=300)
        if "PORT_IN_USE" not in res.stdout:
            return res
        time.sleep(5)
    return res


def test_installed_demo_trains_for_real_and_again_in_the_same_directory(installed):
    """`qwen-tui demo` from the wheel alone: both local nodes start the installed worker and the tiny model
    trains to the end (about 15 s here); --max-seconds bounds it should the machine be slow. Run again in the same
    directory (to show a colleague), it trains again, replacing its own earlier output and saying so."""
    import json

    res = demo(installed)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    (rd,) = (installed["cwd"] / "runs").iterdir()
    recs = [json.loads(ln) for ln in (rd / "metrics.jsonl").read_text().splitlines()]
    assert recs[0]["world_size"] == 2 and recs[0]["method"] == "lora"
    assert recs[-1]["event"] == "end" and recs[-1]["status"] == "ok"
    losses = [r["loss"] for r in recs if "loss" in r and "event" not in r]
    assert len(losses) >= 5 and losses[-1] < losses[0] * 0.8, losses
    out = installed["cwd"] / "output" / "local-demo"
    assert (out / "adapter_model.safetensors").is_file()

    again = demo(installed)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    said = " ".join(again.stdout.split())  # as one line, however the terminal wrapped it
    assert f"replacing the output of the earlier local-demo run in {out} ({rd.name})" in said, said
    second = next(d for d in (installed["cwd"] / "runs").iterdir() if d != rd)
    assert json.loads((second / "state.json").read_text())["status"] == "ok"
    for ckpt in sorted(out.glob("checkpoint-*")):  # every checkpoint there is the second run's now
        assert json.loads((ckpt / "finetune_state.json").read_text())["run_id"] == second.name, ckpt
