"""The launch plan: ranks, environment, torchrun argv, worker args, dry-run output."""

import subprocess
import sys
import textwrap

import pytest

from qwen_tui.cluster.facts import GPU, ClusterFacts, NodeFacts
from qwen_tui.plan.launch import make_plan, worker_args
from qwen_tui.preset.files import parse_preset

FOUR = textwrap.dedent("""\
    version: 1
    cluster:
      nodes:
      - {host: 10.0.0.1, gpus: 8, workdir: /w, python: /venv/bin/python}
      - {host: 10.0.0.2, gpus: 8, workdir: /w, python: /venv/bin/python}
      - {host: 10.0.0.3, gpus: 8, workdir: /w, python: /venv/bin/python}
      - {host: 10.0.0.4, gpus: 8, workdir: /w, python: /venv/bin/python}
    network: {master_port: 29555, rdzv_timeout: 45}
    training:
      model: Qwen/Qwen2.5-14B-Instruct
      data: /data/chat.jsonl
      method: full
      zero_stage: 3
      per_device_train_batch_size: 1
      gradient_accumulation_steps: 4
    """)


def arg(argv, flag):
    return argv[argv.index(flag) + 1]


def test_four_nodes_ranks_env_and_torchrun_args():
    p = parse_preset(FOUR)
    plan = make_plan(p, run_id="r1", local_run_dir="/runs/r1")
    assert [c.rank for c in plan.nodes] == [0, 1, 2, 3]
    assert plan.world_size == 32 and plan.effective_batch_size == 128
    assert "= 128" in plan.batch_formula
    for c in plan.nodes:
        assert c.env["NODE_RANK"] == str(c.rank) == arg(c.argv, "--node_rank")
        assert c.env["NNODES"] == "4" == arg(c.argv, "--nnodes")
        assert c.env["MASTER_ADDR"] == "10.0.0.1" == arg(c.argv, "--master_addr")
        assert c.env["MASTER_PORT"] == "29555" == arg(c.argv, "--master_port")
        assert c.env["GPUS_PER_NODE"] == "8" == arg(c.argv, "--nproc_per_node")
        assert c.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
        assert arg(c.argv, "--rdzv-conf") == "timeout=45"
        assert c.argv[:3] == ["/venv/bin/python", "-m", "torch.distributed.run"]
        assert arg(c.argv, "-m") == "torch.distributed.run"
        i = c.argv.index("training.finetune")
        assert c.argv[i - 1] == "-m"
        assert arg(c.argv, "--deepspeed") == "builtin:zero3"
        assert "--use_lora" not in c.argv
        assert c.run_dir == "/w/.qwen-tui/runs/r1" and not c.local  # under the workdir, as the README says
    # the master's metrics path is absolute on the master, inside its workdir
    assert plan.metrics_file == "/w/.qwen-tui/runs/r1/metrics.jsonl"
    # no shared storage declared: every node saves its own checkpoints
    assert "--save_on_each_node" in plan.nodes[0].argv


def test_worker_args_for_each_method():
    base = parse_preset(FOUR).training
    lora = worker_args(base.model_copy(update={"method": "lora", "lora_target_modules": ["q_proj", "v_proj"]}),
                       metrics_file="m")
    assert "--use_lora" in lora and "--q_lora" not in lora
    assert arg(lora, "--lora_target_modules") == "q_proj,v_proj"
    ql = worker_args(base.model_copy(update={"method": "qlora", "zero_stage": 2}), metrics_file="m")
    assert "--q_lora" in ql and arg(ql, "--deepspeed") == "builtin:zero2"
    ddp = worker_args(base.model_copy(update={"zero_stage": None, "precision": "fp32", "device": "cpu"}),
                      metrics_file="m")
    assert "--deepspeed" not in ddp and "--bf16" not in ddp and "--use_cpu" in ddp
    off = worker_args(base.model_copy(update={"offload": "optimizer"}), metrics_file="m")
    assert arg(off, "--deepspeed") == "builtin:zero3_offload_optimizer"
    extra = worker_args(base.model_copy(update={"extra_args": ["--foo", "a b"]}), metrics_file="m")
    assert extra[-2:] == ["--foo", "a b"]


def test_interfaces_from_facts_unless_preset_fixes_them():
    p = parse_preset(FOUR)
    facts = ClusterFacts(nodes={
        0: NodeFacts(route_interface="ens5", gpus=[GPU(0, "NVIDIA H200", 143771)], ib_devices=["mlx5_0"]),
        1: NodeFacts(route_interface="eth1", gpus=[GPU(0, "NVIDIA H200", 143771)]),
    })
    plan = make_plan(p, run_id="r", local_run_dir="/r", facts=facts)
    assert plan.nodes[0].env["NCCL_SOCKET_IFNAME"] == "ens5" == plan.nodes[0].env["GLOO_SOCKET_IFNAME"]
    assert plan.nodes[1].env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert plan.nodes[0].env["NCCL_IB_DISABLE"] == "0" and plan.nodes[1].env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_SOCKET_IFNAME" not in plan.nodes[2].env  # not probed: leave NCCL to choose
    fixed = p.model_copy(update={"network": p.network.model_copy(update={"interface": "ib0", "nccl_ib_disable": False})})
    plan = make_plan(fixed, run_id="r", local_run_dir="/r", facts=facts)
    assert {c.env["NCCL_SOCKET_IFNAME"] for c in plan.nodes} == {"ib0"}
    assert {c.env["NCCL_IB_DISABLE"] for c in plan.nodes} == {"0"}


def test_local_nodes_share_run_dir_and_resolve_workdir():
    text = textwrap.dedent("""\
        cluster:
          nodes:
          - {host: localhost, workdir: sub}
          - {host: localhost, workdir: sub}
        training: {model: builtin:tiny, data: builtin:demo-chat}
        """)
    p = parse_preset(text)
    plan = make_plan(p, run_id="r", local_run_dir="/abs/runs/r", base_dir="/home/me")
    assert plan.master_addr == "127.0.0.1"
    assert all(c.local and c.run_dir == "/abs/runs/r" and c.workdir == "/home/me/sub" for c in plan.nodes)
    assert plan.metrics_file == "/abs/runs/r/metrics.jsonl"
    assert "--save_on_each_node" not in plan.nodes[0].argv


def test_plan_is_pure_and_repeatable():
    p = parse_preset(FOUR)
    a = make_plan(p, run_id="same", local_run_dir="/r")
    b = make_plan(p, run_id="same", local_run_dir="/r")
    assert a == b
    from qwen_tui.plan.launch import LaunchPlan
    assert LaunchPlan.from_dict(a.to_dict()) == a


def test_dry_run_prints_four_commands(tmp_path):
    f = tmp_path / "four.yaml"
    f.write_text(FOUR)
    out = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "replay", str(f), "--dry-run"],
                         capture_output=True, text=True, timeout=60, env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if "torch.distributed.run" in ln]
    assert len(lines) == 4
    for rank, ln in enumerate(lines):
        assert f"NODE_RANK={rank} " in ln and f"--node_rank {rank} " in ln
        assert "NNODES=4 " in ln and "MASTER_ADDR=10.0.0.1 " in ln and "MASTER_PORT=29555 " in ln
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("hostile", ["a b", "x'; touch /tmp/pwned-plan; '", "$(touch /tmp/pwned-plan)", "`id`"])
def test_shell_line_quotes_everything(hostile, tmp_path):
    text = FOUR.replace("workdir: /w, python: /venv/bin/python}\n  - {host: 10.0.0.2",
                        f"workdir: {hostile!r}, python: /venv/bin/python}}\n  - {{host: 10.0.0.2", 1)
    text = text.replace("data: /data/chat.jsonl", f"data: {hostile!r}")
    p = parse_preset(text)
    c = make_plan(p, run_id="r", local_run_dir="/r").nodes[0]
    line = c.shell_line()
    # bash parses the line back into exactly the planned argv and workdir, executing nothing
    res = subprocess.run(["bash", "-n", "-c", line], capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr
    echo = line.replace(" && env ", " && printf '%s\\n' env ", 1).replace("cd ", "printf '%s\\n' ", 1)
    res = subprocess.run(["bash", "-c", echo], capture_output=True, text=True, timeout=10, cwd=tmp_path)
    words = res.stdout.split("\n")
    assert words[0] == hostile
    assert hostile in words
    assert not __import__("os").path.exists("/tmp/pwned-plan")


def test_local_nodes_use_qwen_tuis_python_unless_the_preset_names_one():
    text = textwrap.dedent("""\
        cluster:
          nodes:
          - {host: localhost}
          - {host: localhost, python: /opt/py/bin/python3}
          - {host: 10.1.1.1}
        training: {model: builtin:tiny, data: builtin:demo-chat}
        """)
    plan = make_plan(parse_preset(text), run_id="r", local_run_dir="/r", local_python="/venv/bin/python")
    assert [c.argv[0] for c in plan.nodes] == ["/venv/bin/python", "/opt/py/bin/python3", "python3"]


def test_local_nodes_on_one_gpu_host_get_their_own_gpus():
    text = textwrap.dedent("""\
        cluster:
          nodes:
          - {host: localhost, gpus: 1}
          - {host: localhost, gpus: 2}
        training: {model: builtin:tiny, data: builtin:demo-chat}
        """)
    plan = make_plan(parse_preset(text), run_id="r", local_run_dir="/r")
    assert [c.env["CUDA_VISIBLE_DEVICES"] for c in plan.nodes] == ["0", "1,2"]
    cpu = parse_preset(text.replace("data: builtin:demo-chat", "data: builtin:demo-chat, device: cpu"))
    assert all("CUDA_VISIBLE_DEVICES" not in c.env for c in make_plan(cpu, run_id="r", local_run_dir="/r").nodes)
    remote = parse_preset(FOUR)
    assert all("CUDA_VISIBLE_DEVICES" not in c.env for c in make_plan(remote, run_id="r", local_run_dir="/r").nodes)


@pytest.mark.parametrize("workdir,run_dir", [("proj", "proj/.qwen-tui/runs/r9"), (".", ".qwen-tui/runs/r9"),
                                             ("~/w", "~/w/.qwen-tui/runs/r9"), ("/abs", "/abs/.qwen-tui/runs/r9")])
def test_remote_logs_live_under_the_workdir_and_the_worker_writes_metrics_there(workdir, run_dir):
    p = parse_preset(textwrap.dedent(f"""
        cluster:
          nodes:
          - {{host: a, workdir: "{workdir}"}}
          - {{host: b, workdir: "{workdir}"}}
        training: {{model: m, data: d.jsonl}}
        """))
    plan = make_plan(p, run_id="r9", local_run_dir="/runs/r9")
    for c in plan.nodes:
        assert c.run_dir == run_dir and c.log_path == f"{run_dir}/node-{c.rank}.log"
    assert plan.metrics_file == f"{run_dir}/metrics.jsonl"  # where qwen-tui reads it (relative: from the login dir)
    worker = plan.nodes[0].argv[plan.nodes[0].argv.index("--metrics_file") + 1]
    # the worker runs in the workdir: its path, taken from there, is the same file
    assert worker == (plan.metrics_file if workdir.startswith("/") else ".qwen-tui/runs/r9/metrics.jsonl")


def test_report_to_reaches_the_worker_which_reads_the_monitors_series_beside_its_metrics(monkeypatch):
    """training.report_to (HF's spellings) -> --report_to; the worker's --node_gpu_file default is where qwen-tui
    appends the monitor's series (beside metrics.jsonl on the master), for a remote master too."""
    from qwen_tui.preset.schema import PresetError
    from qwen_tui.run.watch.gpuseries import series_path
    from training.args import parse_args

    text = FOUR.replace("method: full", "method: full\n  report_to: tensorboard, wandb")
    plan = make_plan(parse_preset(text), run_id="r1", local_run_dir="/runs/r1")
    argv = plan.nodes[0].argv
    assert arg(argv, "--report_to") == "tensorboard,wandb"
    assert all("--report_to" in c.argv for c in plan.nodes)  # every rank parses the same flags; rank 0 logs
    monkeypatch.setenv("RANK", "0")
    args = parse_args(argv[argv.index("training.finetune") + 1:])
    assert args.hf.report_to == ["tensorboard", "wandb"]
    assert args.hf.node_gpu_file == series_path(plan.metrics_file) == "/w/.qwen-tui/runs/r1/gpus.jsonl"
    assert "--report_to" not in make_plan(parse_preset(FOUR.replace("method: full", "method: full\n  report_to: none")),
                                          run_id="r1", local_run_dir="/runs/r1").nodes[0].argv
    with pytest.raises(PresetError, match="report_to"):
        parse_preset(FOUR.replace("method: full", "method: full\n  report_to: [tensorbord]"))
