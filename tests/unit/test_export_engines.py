"""The Kubeflow TrainJob and SkyPilot task exports: each passes its engine's own validation (Kubeflow Trainer's
published models from kubeflow-trainer-api; SkyPilot's own task loader from its wheel), fails it when broken,
and runs the plan's own argv with the engine's placement values (shown by running the command for real with a
Python that prints its arguments, and by torchrun's own parser reading Kubeflow's PET_* variables).

SkyPilot cannot be installed into the test venv (it pins click<8.2.0, which the pinned huggingface-hub, wandb and
import-linter refuse), so its loader runs in a subprocess from a directory of its own, built once into the test
cache from tests/requirements-skypilot-loader.txt (pip --no-deps --target; nothing in the venv changes).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.files import load_preset
from qwen_tui.run.export.engine_argv import RENDEZVOUS_FLAGS
from qwen_tui.run.export.render import render
from support.paths import DEMO, ROOT

PRESETS = sorted((ROOT / "presets").glob("*.yaml"))
SECRET = "hf_TopSecret_4242"
CACHE = Path(os.environ.get("QWEN_TUI_TEST_CACHE") or Path(tempfile.gettempdir()) / "qwen-tui-test-cache")
LOADER_REQS = ROOT / "tests" / "requirements-skypilot-loader.txt"


def plan_for(path, **update):
    preset = load_preset(path)
    if update:
        preset = preset.model_copy(update=update)
    return make_plan(preset, run_id="exp-20261205", local_run_dir="/tmp/runs/exp", base_dir="/home/u")


def exported(plan, fmt, **options) -> dict:
    (text,) = render(plan, fmt, **options).values()
    assert text.startswith(f"# qwen-tui launch plan {plan.run_id} as a ")
    return yaml.safe_load(text)


# ---------------------------------------------------------------- the engines' own validators

def kubeflow_check(doc: dict) -> None:
    """Kubeflow Trainer's TrainJob model: pydantic validation of every field's type and the required ones. Its
    from_dict drops a key it does not know, so a document that does not come back whole names an unknown field."""
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    back = TrainerV1alpha1TrainJob.from_dict(doc).to_dict()
    if back != doc:
        raise ValueError(f"not a TrainJob field: the model gave back {json.dumps(back)[:300]}")


@pytest.fixture(scope="module")
def skypilot_loader() -> Path:
    """A directory holding SkyPilot's wheel and what its task loader imports, beside (not in) the venv."""
    pins = LOADER_REQS.read_text()
    d = CACHE / f"skypilot-loader-{hashlib.sha256(pins.encode()).hexdigest()[:12]}"
    if not (d / "sky" / "task.py").is_file():
        tmp = Path(tempfile.mkdtemp(dir=CACHE if CACHE.is_dir() else None, prefix="skypilot-loader-"))
        res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:",
                              "--target", str(tmp), "-r", str(LOADER_REQS)], capture_output=True, text=True,
                             timeout=600)
        assert res.returncode == 0, f"could not install SkyPilot's loader:\n{res.stderr[-3000:]}"
        try:
            tmp.rename(d)
        except OSError:  # another worker built it first
            shutil.rmtree(tmp, ignore_errors=True)
    return d


SKY_SCRIPT = """
import json, sys, yaml
import sky
out = []
for text in json.load(sys.stdin):
    try:
        t = sky.Task.from_yaml_config(yaml.safe_load(text))
        out.append({"ok": True, "num_nodes": t.num_nodes, "resources": sorted(str(r) for r in t.resources),
                    "envs": dict(t.envs), "managed_secrets": sorted(str(s) for s in getattr(t, "managed_secrets", []) or []),
                    "run": t.run, "setup": t.setup})
    except Exception as e:  # the loader's refusal is the answer this asks for
        out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
"""


def skypilot_load(loader: Path, texts: list[str], tmp_path: Path) -> list[dict]:
    """sky.Task.from_yaml_config on each text, in one process (SkyPilot writes its state under HOME: a scratch one)."""
    env = {**os.environ, "PYTHONPATH": f"{loader}{os.pathsep}{ROOT}", "HOME": str(tmp_path / "home")}
    res = subprocess.run([sys.executable, "-c", SKY_SCRIPT], input=json.dumps(texts), capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.splitlines()[-1])


# ---------------------------------------------------------------- Kubeflow

@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_kubeflow_trainjob_passes_the_trainer_api_models(path):
    plan = plan_for(path)
    doc = exported(plan, "kubeflow", image="registry.example/qwen-tui:1")
    kubeflow_check(doc)
    assert doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and doc["kind"] == "TrainJob"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", doc["metadata"]["name"])
    trainer = doc["spec"]["trainer"]
    assert doc["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert trainer["numNodes"] == plan.nnodes and trainer["numProcPerNode"] == plan.nodes[0].nproc
    assert trainer["image"] == "registry.example/qwen-tui:1"
    # The Trainer's webhook refuses a TrainJob that sets torchrun's placement variables itself.
    names = {e["name"] for e in trainer.get("env", [])}
    assert not names & {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
    if "--use_cpu" in plan.nodes[0].argv:
        assert "resourcesPerNode" not in trainer
    else:
        assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": str(plan.nodes[0].nproc)}}


def test_kubeflow_models_refuse_a_broken_trainjob():
    from pydantic import ValidationError

    good = exported(plan_for(PRESETS[0]), "kubeflow")
    kubeflow_check(good)
    no_runtime = json.loads(json.dumps(good))
    del no_runtime["spec"]["runtimeRef"]["name"]
    text_nodes = json.loads(json.dumps(good))
    text_nodes["spec"]["trainer"]["numNodes"] = "2"
    misspelt = json.loads(json.dumps(good))
    misspelt["spec"]["trainer"]["numNode"] = misspelt["spec"]["trainer"].pop("numNodes")
    for broken, what in ((no_runtime, "runtimeRef.name"), (text_nodes, "numNodes")):
        with pytest.raises(ValidationError, match=what.split(".")[-1]):
            kubeflow_check(broken)
    with pytest.raises(ValueError, match="not a TrainJob field"):
        kubeflow_check(misspelt)


def k8s_expand(word: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of a container command's word: $(NAME) from the container's variables (left as written
    when unknown), $$ gives $, any other $ stays."""
    out, i = [], 0
    while i < len(word):
        if word.startswith("$$", i):
            out.append("$")
            i += 2
        elif word.startswith("$(", i) and ")" in word[i:]:
            name = word[i + 2:word.index(")", i)]
            out.append(env.get(name, f"$({name})"))
            i += len(name) + 3
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def fake_python(tmp_path: Path) -> Path:
    """A 'python' that prints its arguments, one a line, then the placement variables the export sets."""
    fake = tmp_path / "fakepy"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\necho "@ $NNODES $NODE_RANK $MASTER_ADDR $MASTER_PORT"\n')
    fake.chmod(0o755)
    return fake


def demo_plan_with(tmp_path: Path, python: str, workdir: Path, data: str = "builtin:demo-chat"):
    pr = load_preset(DEMO)
    pr = pr.model_copy(update={
        "cluster": pr.cluster.model_copy(update={"nodes": [
            n.model_copy(update={"python": python, "workdir": str(workdir)}) for n in pr.cluster.nodes]}),
        "training": pr.training.model_copy(update={"data": data})})
    return make_plan(pr, run_id="x", local_run_dir=str(tmp_path / "runs"))


def test_kubeflow_command_runs_the_plans_argv_with_torchrun_reading_the_PET_variables(tmp_path):
    """The container command, expanded as Kubernetes does and run for real: it goes to the node's workdir and runs
    the plan's argv without the five placement flags; torchrun's own parser then takes them from PET_*."""
    from torch.distributed.run import get_args_parser

    work = tmp_path / "work dir"
    work.mkdir()
    # a data path holding "$(" must reach the worker as written, not expanded by Kubernetes
    plan = demo_plan_with(tmp_path, str(fake_python(tmp_path)), work, data="data/$(HOME)/chat.jsonl")
    doc = exported(plan, "kubeflow")
    kubeflow_check(doc)
    pet = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1",
           "PET_MASTER_ADDR": "exp-node-0-0.exp", "PET_MASTER_PORT": "29400"}
    env = {**{e["name"]: e["value"] for e in doc["spec"]["trainer"]["env"]}, **pet}
    argv = [k8s_expand(w, env) for w in doc["spec"]["trainer"]["command"]]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=tmp_path,
                         env={"PATH": os.environ["PATH"], **env})
    assert res.returncode == 0, res.stderr
    *printed, placement = res.stdout.splitlines()
    head = plan.nodes[0].argv
    dropped = {i for i, a in enumerate(head) if a in RENDEZVOUS_FLAGS} | \
              {i + 1 for i, a in enumerate(head) if a in RENDEZVOUS_FLAGS}
    assert printed == [a for i, a in enumerate(head) if i not in dropped][1:]
    assert "data/$(HOME)/chat.jsonl" in printed
    assert placement == "@ 2 1 exp-node-0-0.exp 29400"
    # torchrun's parser (PET_<FLAG> for a flag not on the command line) reads the placement from Kubeflow's values
    os_env = dict(os.environ)
    try:
        os.environ.update(pet)
        args = get_args_parser().parse_args(printed[printed.index("torch.distributed.run") + 1:])
    finally:
        os.environ.clear()
        os.environ.update(os_env)
    assert (args.nnodes, args.node_rank, args.nproc_per_node, args.master_addr, args.master_port) == \
        ("2", 1, "1", "exp-node-0-0.exp", 29400)
    assert args.training_script == "training.finetune" and args.module
    assert args.training_script_args == head[head.index("training.finetune") + 1:]


# ---------------------------------------------------------------- SkyPilot

def test_skypilot_tasks_pass_skypilot_loader_and_broken_ones_fail(skypilot_loader, tmp_path):
    plans = [plan_for(p) for p in PRESETS]
    texts = [next(iter(render(p, "skypilot").values())) for p in plans]
    one = yaml.safe_load(texts[0])
    broken = {
        "num_nodes as text": {**one, "num_nodes": "two"},
        "an unknown field": {**{k: v for k, v in one.items() if k != "run"}, "runn": one["run"]},
        "a variable without a value": {**one, "envs": {**one.get("envs", {}), "HF_HOME": None}},
        "an unknown resource": {**one, "resources": {**one["resources"], "gpu": 8}},
    }
    big = plan_for(ROOT / "presets/qwen2.5-14b-full-4node-zero3.yaml")
    extra = [next(iter(render(big, "skypilot", accelerator="H200", image="registry.example/q:1").values()))]
    got = skypilot_load(skypilot_loader, texts + extra + [yaml.safe_dump(b) for b in broken.values()], tmp_path)
    for plan, text, r in zip(plans, texts, got):
        assert r["ok"], (plan.run_id, r.get("error"), text)
        assert r["num_nodes"] == plan.nnodes
        assert r["run"] == yaml.safe_load(text)["run"]
        if "--use_cpu" in plan.nodes[0].argv:
            assert r["resources"] == [f"<Cloud>(cpus={max(4, 2 * plan.nodes[0].nproc)}+)"]
        else:  # any of the three GPUs, as many a node as the plan runs processes
            n = plan.nodes[0].nproc
            assert len(r["resources"]) == 3 and all(f"': {n}}})" in s for s in r["resources"]), r["resources"]
    chosen = got[len(texts)]
    assert chosen["ok"] and chosen["resources"] == ["<Cloud>({'H200': 8}, image_id=docker:registry.example/q:1)"]
    for (what, _), r in zip(broken.items(), got[len(texts) + 1:]):
        assert not r["ok"], what
    errors = [r["error"] for r in got[len(texts) + 1:]]
    assert "num_nodes" in errors[0] and "runn" in errors[1] and "HF_HOME" in errors[2] and "gpu" in errors[3]


def test_skypilot_run_script_is_the_plans_argv_with_skypilots_placement(tmp_path):
    work = tmp_path / "work dir"
    work.mkdir()
    plan = demo_plan_with(tmp_path, str(fake_python(tmp_path)), work)
    task = exported(plan, "skypilot")
    sky_env = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.8", "SKYPILOT_NUM_NODES": "2",
               "SKYPILOT_NUM_GPUS_PER_NODE": "0"}
    res = subprocess.run(["bash", "-c", task["run"]], capture_output=True, text=True, timeout=10,
                         env={"PATH": os.environ["PATH"], **task["envs"], **sky_env})
    assert res.returncode == 0, res.stderr
    *printed, placement = res.stdout.splitlines()
    head = plan.nodes[0].argv
    want = list(head[1:])
    for flag, value in (("--nnodes", "2"), ("--node_rank", "1"), ("--master_addr", "10.0.0.7"),
                        ("--nproc_per_node", "1")):  # a CPU run: the plan's own process count, not SkyPilot's GPUs
        want[want.index(flag) + 1] = value
    assert printed == want
    assert placement == f"@ 2 1 10.0.0.7 {plan.master_port}"
    # setup refuses a node whose Python has no worker, saying what to install
    bad = subprocess.run(["bash", "-c", task["setup"].replace(shlex.quote(head[0]), "false", 1)],
                         capture_output=True, text=True, timeout=10)
    assert bad.returncode == 1 and "pip install qwen-tui[train]" in bad.stderr


def test_gpu_skypilot_task_takes_the_processes_from_skypilots_gpus():
    run = exported(plan_for(ROOT / "presets/qwen2.5-14b-full-4node-zero3.yaml"), "skypilot")["run"]
    assert '--nproc_per_node "$SKYPILOT_NUM_GPUS_PER_NODE"' in run and '--node_rank "$SKYPILOT_NODE_RANK"' in run


# ---------------------------------------------------------------- secrets, refusals, the command line

def test_secrets_are_named_never_written(tmp_path):
    d = yaml.safe_load(DEMO.read_text())
    d["network"]["env"] = {"HF_TOKEN": SECRET, "MY_NOTE": "plain"}
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    for fmt in ("kubeflow", "skypilot"):
        res = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "export", str(p), "--format", fmt, "-o",
                              str(tmp_path / f"{fmt}.yaml")], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        text = (tmp_path / f"{fmt}.yaml").read_text()
        assert SECRET not in text
        doc = yaml.safe_load(text)
        if fmt == "kubeflow":
            kubeflow_check(doc)
            env = {e["name"]: e for e in doc["spec"]["trainer"]["env"]}
            assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": "qwen-tui-secrets", "key": "HF_TOKEN"}}}
            assert env["MY_NOTE"] == {"name": "MY_NOTE", "value": "plain"}
        else:
            assert doc["secrets"] == {"HF_TOKEN": None} and doc["envs"]["MY_NOTE"] == "plain"
            assert "sky launch --secret HF_TOKEN" in text


def test_engines_refuse_nodes_of_different_sizes_naming_the_node(tmp_path):
    d = yaml.safe_load((ROOT / "presets/qwen2.5-7b-lora-2node-zero2.yaml").read_text())
    d["cluster"]["nodes"][1]["gpus"] = 4
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d))
    for fmt in ("kubeflow", "skypilot"):
        out = tmp_path / f"{fmt}.yaml"
        res = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "export", str(p), "--format", fmt, "-o", str(out)],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert res.returncode == 2 and "cluster.nodes.1.gpus" in res.stderr and "node 1" in res.stderr, res.stderr
        assert not out.exists()
    for fmt, why in (("kubeflow", "only the skypilot format"), ("skypilot", "training.device: cpu")):
        res = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "export", str(DEMO), "--format", fmt,
                              "--accelerator", "H100"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert res.returncode == 2 and why in res.stderr and not res.stdout, res.stderr
