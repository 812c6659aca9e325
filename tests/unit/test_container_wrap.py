"""Each node's worker in a container: the preset's `container:` section, and the runtime's command the plan wraps
the worker in (plan/container.py) for podman, docker, Apptainer and enroot: the flags multi-node training
needs, the mounts, quoting, the environment passed by name (secrets never in an argv), the stop's order."""

from __future__ import annotations

import os
import shlex
import subprocess
import textwrap

import pytest

from qwen_tui.cluster.facts import GPU, ClusterFacts, IBPort, NodeFacts
from qwen_tui.nodes import jobs
from qwen_tui.nodes.jobs import JobRef, Proc, workers
from qwen_tui.plan import container as box
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.files import parse_preset
from qwen_tui.preset.schema import PresetError
from qwen_tui.run.export.render import render_sh, render_slurm

BASE = textwrap.dedent("""\
    cluster:
      nodes:
      - {host: n0, gpus: 2, workdir: /work/run}
      - {host: n1, gpus: 2, workdir: /work/run}
    network: {env: {HF_TOKEN: s3cret-value, HF_HOME: /cache/hf}}
    training:
      model: /models/qwen2.5-7b
      data: /data/chat.jsonl
      output_dir: /out/run1
    """)


def plan_for(container: str, base: str = BASE, facts=None):
    p = parse_preset(base + "container: " + container)
    return make_plan(p, run_id="20261205-101010-ab12", local_run_dir="/runs/x", facts=facts)


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_podman_runs_the_worker_with_every_flag_multinode_training_needs():
    plan = plan_for("{runtime: podman, image: localhost/qwen-tui-worker:0.1.0, pass_env: [WANDB_API_KEY]}")
    c = plan.nodes[1]
    # the worker's own argv is untouched: its Python is the image's, its flags are the plan's
    assert c.argv[:3] == ["python3", "-m", "torch.distributed.run"]
    assert c.command == [*c.container, *c.argv]
    # the output directory (outside the workdir) is made before podman mounts it
    assert c.container[:7] == ["sh", "-c", box.MKDIRS, "sh", "/out/run1", "/cache/hf", "--"]
    run = c.container[7:]
    assert run[:8] == ["podman", "run", "--rm", "--name", "qwen-tui-20261205-101010-ab12-node1", "--pull", "never",
                       "--replace"]
    for flag, value in (("--network", "host"), ("--pid", "host"), ("--ipc", "host"), ("--uts", "host"),
                        ("--ulimit", "memlock=-1:-1"), ("--security-opt", "label=disable"),
                        ("--device", "nvidia.com/gpu=all"), ("--workdir", "/work/run")):
        assert value in flag_values(run, flag), (flag, run)
    assert "--gpus" not in run and "/dev/infiniband" not in run  # docker's flag; no HCA known on the node
    # the workdir (which holds the run directory), the directories of what is read, what is written
    assert flag_values(run, "--volume") == ["/work/run:/work/run", "/data:/data", "/models:/models",
                                            "/out/run1:/out/run1", "/cache/hf:/cache/hf"]
    env = flag_values(run, "--env")
    assert {"NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "HF_TOKEN", "HF_HOME", "WANDB_API_KEY",
            *jobs.MARKS} <= set(env)
    assert run[-1] == "localhost/qwen-tui-worker:0.1.0"


def test_secrets_pass_by_name_only_never_in_an_argv_a_printed_line_or_a_script():
    plan = plan_for("{runtime: podman, image: img, env: {IN_CONTAINER: 'yes'}, pass_env: [WANDB_API_KEY]}")
    for c in plan.nodes:
        assert not any("s3cret-value" in a for a in c.command)
        assert "--env" in c.container and "HF_TOKEN" in flag_values(c.container, "--env")
        assert not any("=" in v for v in flag_values(c.container, "--env"))  # names, never NAME=value
        assert c.env["HF_TOKEN"] == "s3cret-value"  # the value is in the job's environment, which the launch
        assert c.env["IN_CONTAINER"] == "yes"  # sends in a 0600 file that the job removes (nodes/jobs.py)
        line = c.shell_line()
        assert "s3cret-value" not in line and 'HF_TOKEN="$HF_TOKEN"' in line
        assert "s3cret-value" not in render_sh(plan, c)
    assert "s3cret-value" not in render_slurm(plan)
    assert "--env HF_TOKEN" in render_slurm(plan) and "podman run" in render_slurm(plan)


def test_paths_survive_as_one_argument_each_whatever_they_hold():
    hostile = "/work/a dir; $(touch /tmp/qt-pwned) 'x'"
    base = BASE.replace("/work/run", hostile.replace("'", "''")).replace("workdir: /work", "workdir: '/work")
    base = base.replace("a dir; $(touch /tmp/qt-pwned) ''x''}", "a dir; $(touch /tmp/qt-pwned) ''x'''}")
    plan = plan_for("{runtime: podman, image: img}", base=base)
    c = plan.nodes[0]
    assert c.workdir == hostile
    assert f"{hostile}:{hostile}" in flag_values(c.container, "--volume")
    assert hostile in flag_values(c.container, "--workdir")
    # the printed line gives the same argv back to a shell
    assert shlex.split(c.shell_line().split(" && env ", 1)[1])[-len(c.command):] == c.command


def test_the_mkdir_step_makes_the_directories_and_runs_the_command_with_its_argv_intact(tmp_path):
    odd = tmp_path / "out dir; $(touch pwned)"
    second = tmp_path / "cache" / "hf"
    argv = ["sh", "-c", box.MKDIRS, "sh", str(odd), str(second), "--", "printf", "%s\\n", "a b", "$HOME", "--"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["a b", "$HOME", "--"]
    assert odd.is_dir() and second.is_dir() and not (tmp_path / "pwned").exists()
    # a directory it cannot make stops it before the runtime starts (the runtime's own exit code for it)
    (tmp_path / "file").write_text("")
    r = subprocess.run(["sh", "-c", box.MKDIRS, "sh", str(tmp_path / "file" / "x"), "--", "true"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 125


def test_mounts_cover_the_run_paths_once_and_never_the_images_system():
    base = textwrap.dedent("""\
        cluster:
          nodes: [{host: n0, workdir: /work/run}]
        network: {env: {QWEN_TUI_CACHE: /work/run/cache, XDG_CACHE_HOME: relative/cache, TRITON_CACHE_DIR: /tmp/t}}
        training:
          model: builtin:tiny
          data: data/chat.jsonl
          eval_data: /chat.jsonl
          output_dir: out
          tokenized_cache_dir: /scratch/tok
        """)
    c = plan_for("{runtime: podman, image: img, mounts: ['/shared/ds:/ds:ro', /scratch]}", base=base).nodes[0]
    vols = flag_values(c.container, "--volume")
    # the workdir holds the relative paths and the cache under it; a file at / is mounted alone (never / itself);
    # the token cache lies under one of the preset's own mounts, which come last
    assert vols == ["/work/run:/work/run", "/chat.jsonl:/chat.jsonl", "/tmp/t:/tmp/t", "/shared/ds:/ds:ro",
                    "/scratch:/scratch"]
    assert c.container[:6] == ["sh", "-c", box.MKDIRS, "sh", "/tmp/t", "--"]


@pytest.mark.parametrize("ulimits,want", [
    ("{}", ["memlock=-1:-1"]),
    ("{memlock: host}", []),
    ("{nofile: '65536:65536', stack: '67108864'}", ["memlock=-1:-1", "nofile=65536:65536", "stack=67108864"]),
])
def test_memlock_is_unlimited_unless_the_node_keeps_its_own(ulimits, want):
    c = plan_for("{runtime: docker, image: img, ulimits: " + ulimits + "}").nodes[0]
    assert flag_values(c.container, "--ulimit") == want


def _facts(gpus: bool, ib: bool) -> ClusterFacts:
    port = [IBPort(hca="mlx5_0", port=1, state="ACTIVE", link_layer="InfiniBand")] if ib else []
    gpu = [GPU(index=0, name="NVIDIA H200", memory_total_mib=143771)] if gpus else []
    return ClusterFacts(nodes={i: NodeFacts(gpus=gpu, ib_devices=["mlx5_0"] if ib else [], ib_ports=port,
                                            route_interface="eth0") for i in (0, 1)})


def test_gpus_and_infiniband_follow_the_run_and_the_node():
    c = plan_for("{runtime: podman, image: img}", facts=_facts(gpus=True, ib=True)).nodes[0]
    assert "nvidia.com/gpu=all" in flag_values(c.container, "--device")
    assert "/dev/infiniband" in flag_values(c.container, "--device")
    assert flag_values(c.container, "--cap-add") == ["IPC_LOCK"] and c.env["NCCL_IB_DISABLE"] == "0"
    # a node the probe found without GPUs gets none; a node without HCAs no /dev/infiniband
    c = plan_for("{runtime: podman, image: img}", facts=_facts(gpus=False, ib=False)).nodes[0]
    assert "--device" not in c.container and "--cap-add" not in c.container
    # a CPU run hands over no GPU, whatever the node has
    cpu = BASE.replace("output_dir: /out/run1", "output_dir: /out/run1\n  device: cpu")
    c = plan_for("{runtime: docker, image: img}", base=cpu, facts=_facts(gpus=True, ib=False)).nodes[0]
    assert "--gpus" not in c.container
    c = plan_for("{runtime: docker, image: img}", facts=_facts(gpus=True, ib=False)).nodes[0]
    assert flag_values(c.container, "--gpus") == ["all"] and "--replace" not in c.container


def test_apptainer_shares_the_nodes_namespaces_and_environment_and_binds_the_paths():
    c = plan_for("{runtime: apptainer, image: /images/qwen-tui.sif}").nodes[0]
    run = c.container[7:]
    assert run[:3] == ["apptainer", "exec", "--nv"]
    assert flag_values(run, "--bind")[:2] == ["/work/run:/work/run", "/data:/data"]
    assert flag_values(run, "--pwd") == ["/work/run"]
    assert "--env" not in run and "--network" not in run  # it passes the environment in and shares the node's
    assert run[-1] == "/images/qwen-tui.sif" and c.argv[0] == "python3"
    assert box.removal_argv(c.container) is None  # no container outlives its job


def test_enroot_turns_on_its_hooks_mounts_fstab_lines_and_starts_in_the_workdir():
    c = plan_for("{runtime: enroot, image: /images/qwen-tui.sqsh, mounts: ['/ds:/ds:ro']}",
                 facts=_facts(gpus=True, ib=True)).nodes[0]
    run = c.container[7:]
    assert run[:2] == ["enroot", "start"]
    env = flag_values(run, "--env")
    assert {"NVIDIA_VISIBLE_DEVICES=all", "MELLANOX_VISIBLE_DEVICES=all", "HF_TOKEN", *jobs.MARKS} <= set(env)
    mounts = flag_values(run, "--mount")
    assert "/work/run:/work/run:none:x-create=auto,rbind" in mounts and "/ds:/ds:none:x-create=auto,rbind,ro" in mounts
    i = run.index("/images/qwen-tui.sqsh")
    assert run[i + 1:] == ["sh", "-c", 'cd -- "$1" || exit 125; shift; exec "$@"', "sh", "/work/run"]


SLURM = BASE.replace("cluster:", "scheduler: {kind: slurm, job_id: '4242'}\ncluster:")


def test_pyxis_runs_each_nodes_worker_as_a_container_step_of_the_allocation_on_that_node():
    plan = plan_for("{runtime: pyxis, image: 'nvcr.io#nvidia/pytorch:24.12-py3', mounts: ['/ds:/ds:ro'], "
                    "pass_env: [WANDB_API_KEY], extra_args: [--container-writable]}", base=SLURM,
                    facts=_facts(gpus=True, ib=True))
    for c in plan.nodes:
        assert c.container[:7] == ["sh", "-c", box.MKDIRS, "sh", "/out/run1", "/cache/hf", "--"]
        run = c.container[7:]
        # enroot's hooks are told to hand in the GPUs and HCAs; the step is srun's, on this node, all of it
        assert run[:4] == ["env", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                           "MELLANOX_VISIBLE_DEVICES=all"]
        step = run[4:]
        assert step[:3] == ["srun", "--overlap", "--whole"] and flag_values(step, "--nodelist") == [c.host]
        assert flag_values(step, "--ntasks") == ["1"] and "--kill-on-bad-exit=1" in step
        opts = dict(a.split("=", 1) for a in step if a.startswith("--container-") and "=" in a)
        assert opts["--container-image"] == "nvcr.io#nvidia/pytorch:24.12-py3"
        assert opts["--container-workdir"] == "/work/run"
        assert opts["--container-mounts"].split(",") == ["/work/run:/work/run", "/data:/data", "/models:/models",
                                                         "/out/run1:/out/run1", "/cache/hf:/cache/hf", "/ds:/ds:ro"]
        # the job's variables win over the image's, by name: values (the token's) never in the argv
        names = opts["--container-env"].split(",")
        assert {"MASTER_ADDR", "NODE_RANK", "HF_TOKEN", "WANDB_API_KEY", "NVIDIA_VISIBLE_DEVICES",
                *jobs.MARKS} <= set(names) and "PATH" not in names
        assert not any("s3cret-value" in a for a in c.command)
        assert step[-1] == "--container-writable" and c.command[len(c.container):] == c.argv
        assert c.argv[:3] == ["python3", "-m", "torch.distributed.run"]
    # no container outlives its task; the rehearsal's extra names are named again; stdin reaches the task as is
    c = plan.nodes[0].container
    assert box.removal_argv(c) is None and box.with_stdin(c) == c
    more = box.with_env(c, ["QT_BACKEND", "QT_X"])
    i = more.index("srun")
    assert more[i:i + 3] == ["srun", "--overlap", "--container-env=QT_BACKEND,QT_X"] and more[i + 3:] == c[i + 2:]
    # on CPU no GPU hook; without InfiniBand no HCA hook
    cpu = plan_for("{runtime: pyxis, image: /i/w.sqsh}", base=SLURM.replace("output_dir: /out/run1",
                                                                            "output_dir: /out/run1\n  device: cpu"))
    assert "env" not in cpu.nodes[0].container and "NVIDIA_VISIBLE_DEVICES" not in str(cpu.nodes[0].container)


def test_the_wrap_for_a_launcher_of_its_own_and_the_names_it_passes():
    spec = parse_preset(BASE + "container: {runtime: podman, image: img, pass_env: [HF_TOKEN]}").container
    argv = box.wrap(spec, ["python3", "-m", "torch.distributed.run", "--nnodes", "2"], name="job-7-node0",
                    workdir="/w", env=["PATH", "HOME", "MASTER_ADDR", "HF_TOKEN"], gpus=False)
    assert argv[:4] == ["podman", "run", "--rm", "--name"] and argv[-5:] == ["python3", "-m",
                                                                             "torch.distributed.run", "--nnodes", "2"]
    # the node's PATH and HOME stay out (the image has its own); the marks always go in; each name once
    assert flag_values(argv, "--env") == ["MASTER_ADDR", "HF_TOKEN", *box.JOB_MARKS]
    assert flag_values(argv, "--volume") == ["/w:/w"]
    assert set(box.JOB_MARKS) == set(jobs.MARKS)
    # a job that adds variables (the rehearsal's) passes them too, right after `run`
    more = box.with_env(argv, ["QT_BACKEND"])
    assert more[:4] == ["podman", "run", "--env", "QT_BACKEND"] and more[4:] == argv[2:]
    assert box.with_stdin(argv)[:3] == ["podman", "run", "--interactive"]  # the chat reads its prompt there
    assert box.removal_argv(argv) == ["podman", "rm", "--force", "--ignore", "job-7-node0"]
    assert box.container_name("a/b c", 3) == "qwen-tui-a_b_c-node3"


def test_without_a_container_the_plan_is_as_before():
    p = parse_preset(BASE.replace("workdir: /work/run", "workdir: /work/run, python: /venv/bin/python"))
    c = make_plan(p, run_id="r", local_run_dir="/runs/r").nodes[0]
    assert c.container == [] and c.command == c.argv and c.argv[0] == "/venv/bin/python"


@pytest.mark.parametrize("section,said", [
    ("{runtime: singularity, image: x}", "container.runtime: Input should be 'podman', 'docker', 'apptainer', "
                                         "'enroot' or 'pyxis', got 'singularity'"),
    ("{runtime: podman}", "container.image: is required"),
    ("{runtime: podman, image: '--privileged'}", "container.image: must not start with '-'"),
    ("{runtime: podman, image: x, mounts: [data]}", "container.mounts: 'data': 'data' is not an absolute path"),
    ("{runtime: podman, image: x, mounts: ['/a:/b:rx']}", "container.mounts: '/a:/b:rx': must be HOST"),
    ("{runtime: podman, image: x, mounts: ['/a,b']}", "container.mounts: '/a,b': no commas"),
    ("{runtime: podman, image: x, pass_env: ['HF TOKEN']}", "container.pass_env: 'HF TOKEN' is not a valid"),
    ("{runtime: podman, image: x, ulimits: {memlok: '-1'}}", "container.ulimits: 'memlok' is not a limit"),
    ("{runtime: podman, image: x, ulimits: {memlock: lots}}", "container.ulimits: memlock: 'lots' must be"),
    ("{runtime: enroot, image: x.sqsh, ulimits: {memlock: '-1'}}", "container.ulimits: enroot has no --ulimit"),
    ("{runtime: pyxis, image: x.sqsh, ulimits: {memlock: '-1'}}", "container.ulimits: pyxis has no --ulimit"),
    ("{runtime: pyxis, image: x.sqsh}", "container.runtime: pyxis is srun's --container-image, so it needs "
                                        "scheduler.kind: slurm"),
    ("{runtime: podman, image: x, imgae: y}", "container.imgae: unknown key (did you mean 'image'?)"),
])
def test_a_bad_container_section_is_refused_naming_the_field(section, said):
    with pytest.raises(PresetError) as e:
        parse_preset(BASE + "container: " + section, "p.yaml")
    assert said in str(e.value), str(e.value)
    assert "p.yaml:10 " in str(e.value)  # the line of the container section


def test_paths_a_container_cannot_mean_the_same_way_are_refused():
    relative = BASE.replace("- {host: n1, gpus: 2, workdir: /work/run}", "- {host: n1, gpus: 2}")
    with pytest.raises(PresetError, match=r"cluster.nodes.1.workdir: '.' is relative to the login directory"):
        parse_preset(relative + "container: {runtime: podman, image: x}")
    tilde = BASE.replace("data: /data/chat.jsonl", "data: ~/chat.jsonl")
    with pytest.raises(PresetError, match=r"training.data: '~/chat.jsonl': inside a container ~ is the image's"):
        parse_preset(tilde + "container: {runtime: podman, image: x}")
    # the same preset without a container is fine: the node resolves both itself
    parse_preset(relative)
    parse_preset(tilde)


def test_a_torchrun_agent_in_a_container_is_left_to_see_its_workers_end():
    ref = JobRef(100, 5, "run")

    def p(pid, pgrp, ppid, marked=True):
        return Proc(pid, pgrp, 7, "S", {jobs.RUN_MARK: "run", jobs.JOB_MARK: "100"} if marked else {}, ppid)

    shell, client = p(100, 100, 1), p(101, 100, 100)
    conmon = p(150, 150, 1, marked=False)  # the runtime's monitor carries no mark
    agent, rank, loader = p(160, 160, 150), p(170, 170, 160), p(171, 170, 170)
    procs = [shell, client, conmon, agent, rank, loader]
    assert [x.pid for x in workers(ref, procs)] == [170, 171]  # the ranks and what they started, not the agent
    assert {x.pid for x in jobs.members(ref, procs)} == {100, 101, 160, 170, 171}  # the agent is still the job's
    # on the node itself the agent is in the job's group, its ranks its children, as before
    host_agent, host_rank = p(102, 100, 100), p(180, 180, 102)
    assert [x.pid for x in workers(ref, [shell, host_agent, host_rank])] == [180]
    # a process whose parent was not read counts as before (outside the group: a worker)
    assert [x.pid for x in workers(ref, [shell, Proc(190, 190, 7, "S", agent.marks)])] == [190]


def test_the_parent_pid_is_read_from_stat_whatever_the_command_is_called():
    stat = "4242 (python3 (x) y) S 4100 4242 4242 0 -1 4194560 " + " ".join(["0"] * 12) + " 777 0"
    assert jobs.parse_ppid(stat) == 4100 and jobs.parse_stat(stat) == ("S", 4242, 777)
    assert jobs.parse_ppid("garbage") is None
    me = jobs.local_proc(os.getpid())
    assert me is not None and me.ppid == os.getppid()


def _preset(container: str):
    return parse_preset(BASE + "container: " + container)


def test_how_each_runtime_is_asked_for_the_image_and_what_fixes_a_missing_one():
    from qwen_tui.nodes.checks.containers import image_argv, image_fix

    podman = _preset("{runtime: podman, image: localhost/w:1}").container
    assert image_argv(podman) == ["podman", "image", "exists", "localhost/w:1"]
    assert "podman save localhost/w:1 | ssh node7 podman load" in image_fix(podman, "node7")
    docker = _preset("{runtime: docker, image: w:1}").container
    assert image_argv(docker)[:3] == ["docker", "image", "inspect"]
    assert image_argv(_preset("{runtime: apptainer, image: /i/w.sif}").container) == ["test", "-e", "/i/w.sif"]
    assert image_argv(_preset("{runtime: apptainer, image: 'docker://w:1'}").container) is None  # it pulls
    assert image_argv(_preset("{runtime: enroot, image: /i/w.sqsh}").container) == ["test", "-e", "/i/w.sqsh"]
    named = image_argv(_preset("{runtime: enroot, image: qwen-worker}").container)
    assert named[:2] == ["sh", "-c"] and named[-1] == "qwen-worker" and "enroot list" in named[2]
    pyxis = parse_preset(SLURM + "container: {runtime: pyxis, image: /i/w.sqsh}").container
    assert image_argv(pyxis) == ["test", "-e", "/i/w.sqsh"] and "enroot import -o /i/w.sqsh" in image_fix(pyxis, "n")
    assert image_argv(parse_preset(SLURM + "container: {runtime: pyxis, image: 'nvcr.io#nvidia/pytorch:24.12-py3'}"
                                   ).container) is None  # pyxis imports it
    from qwen_tui.nodes.checks.containers import start_failure

    said = start_failure(parse_preset(SLURM + "container: {runtime: pyxis, image: /i/w.sqsh}"), 0, 1,
                         "srun: unrecognized option '--container-image=/i/w.sqsh'")
    assert "under pyxis" in said.message and "plugstack.conf" in said.fix


@pytest.mark.parametrize("rc,err,fix", [
    (126, "error setting rlimit type 8: operation not permitted", "container.ulimits: {memlock: host}"),
    (125, 'Error: setting up CDI devices: unresolvable CDI devices nvidia.com/gpu=all', "nvidia-ctk cdi generate"),
    (127, 'crun: executable file not found in $PATH: "python3"', "set container.python"),
])
def test_a_container_that_does_not_start_is_named_with_what_usually_fixes_it(rc, err, fix):
    from qwen_tui.nodes.checks.containers import start_failure

    f = start_failure(_preset("{runtime: podman, image: w}"), 1, rc, err)
    assert f.code == "CONTAINER_START_FAILED" and f.node == 1 and f.check == "container"
    assert f.message.startswith(f"n1: the container did not start under podman (exit {rc}): ") and err in f.message
    assert fix in f.fix


def test_the_image_is_judged_by_what_the_probe_found_inside_it():
    from qwen_tui import __version__
    from qwen_tui.nodes.checks.runner import consistency

    p = _preset("{runtime: podman, image: w}")
    good = {"torch": "2.13.0", "transformers": "5.25.0", "peft": "0.21.2", "accelerate": "1.1", "qwen-tui": __version__}
    facts = ClusterFacts(nodes={0: NodeFacts(versions=good, training_importable=True, gpus=[], python_version="3.11.2"),
                                1: NodeFacts(versions={"transformers": "5.25.0"}, training_importable=False, gpus=[],
                                             python_version="3.11.2")})
    out = consistency(p, facts)
    lacks = [f for f in out if f.code == "IMAGE_LACKS_WORKER"]
    assert [f.node for f in lacks] == [1]
    assert "n1: the image w lacks torch, peft, accelerate, qwen-tui's worker (the training package) for python3" \
        == lacks[0].message and "containers/build-image.sh" in lacks[0].fix
    assert not [f for f in out if f.code in ("TORCH_MISSING", "CODE_MISSING")]  # the node's Python is not asked
    info = [f for f in out if f.code == "CONTAINER"]
    assert [f.node for f in info] == [0] and f"qwen-tui {__version__}, torch 2.13.0" in info[0].message
    older = ClusterFacts(nodes={0: NodeFacts(versions={**good, "qwen-tui": "0.0.1"}, training_importable=True,
                                             gpus=[], python_version="3.11.2")})
    assert [f.code for f in consistency(p, older) if f.check == "container"] == ["CONTAINER", "IMAGE_WORKER_VERSION"]


def test_the_rehearsal_runs_in_the_nodes_container_with_its_own_variables_passed_in():
    from qwen_tui.nodes.checks.rehearsal import rehearsal_job

    c = plan_for("{runtime: podman, image: img}").nodes[1]
    argv, env = rehearsal_job(c, "nccl", c.argv[0], 32.0, 30)
    run = argv[argv.index("podman"):]
    assert run[:2] == ["podman", "run"] and "img" in run
    # the names the rehearsal adds to the plan's environment go in by name too, right after `run`
    assert set(flag_values(run[:run.index("--rm")], "--env")) == {"QT_BACKEND", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS"}
    assert env["QT_BACKEND"] == "nccl" and env["NCCL_DEBUG"] == "INFO"
    # then the image's Python runs the rehearsal program under the plan's torchrun flags
    tail = argv[argv.index("img") + 1:]
    assert tail[:3] == ["python3", "-m", "torch.distributed.run"] and "--no-python" in tail
    assert "training.finetune" not in tail
    # without a container, the node's own command as before
    plain = make_plan(parse_preset(BASE), run_id="r", local_run_dir="/runs/r").nodes[0]
    argv, _ = rehearsal_job(plain, "nccl", plain.argv[0], 32.0, 30)
    assert argv[0] == plain.argv[0] and "podman" not in argv
