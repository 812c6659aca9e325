"""SLURM and a container in one run, on the namespace cluster's real SLURM and real podman: inside an allocation,
every node's probe runs in the image through srun, and every node's training step (srun) runs its ranks in the
node's own container, on the node's network; the run completes and leaves no process and no container.

Run as root, as the container tests are: the nodes' podman is rootful (tests/support/podman_nodes.py); a login
user's rootless podman lacks what these namespaces do not give (docs/containers.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from qwen_tui.plan.container import container_name
from support.cluster import REPO
from support.podman_nodes import BUILD_BOUND_S
from support.procs import environ_of
from support.slurm import slurm_preset

pytestmark = pytest.mark.timeout(BUILD_BOUND_S + 600)


def _left(cluster, podman, bound: float = 30.0) -> dict:
    """{} once no node holds a process of a run (its daemons aside) or a container; else what is there."""
    nodes, _ = podman
    deadline = time.monotonic() + bound
    while True:
        left = {i: (cluster.job_pids(i), nodes.containers(i)) for i in range(len(cluster.nodes))}
        left = {i: v for i, v in left.items() if any(v)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_inside_an_allocation_each_nodes_step_trains_in_its_container(cluster, slurm, field, podman, tmp_path):
    nodes, tag = podman
    slurm.wait_all_idle()
    d = yaml.safe_load(slurm_preset(field, "slurm-podman", max_steps=12, learning_rate=5e-3).read_text())
    d["network"]["env"] = {"OMP_NUM_THREADS": "1", "QWEN_TUI_CACHE": os.environ["QWEN_TUI_CACHE"],
                           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    d["network"]["rdzv_timeout"] = 90  # three containers' first start on two loaded cores
    d["container"] = {"runtime": "podman", "image": tag, "ulimits": {"memlock": "host"}}  # as test_containers.py
    path = tmp_path / "slurm-podman.yaml"
    path.write_text(yaml.safe_dump(d))
    log = tmp_path / "replay.log"
    with open(log, "w") as sink:
        replay = subprocess.Popen(["salloc", "-N3", "--cpus-per-task=1", sys.executable, "-m", "qwen_tui.cli",
                                   "replay", str(path), "--max-seconds", "300"],
                                  stdout=sink, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                  env={**os.environ, **slurm.env, "COLUMNS": "250"})
    try:
        seen: dict[int, str] = {}
        deadline = time.monotonic() + 360
        while len(seen) < 3 and replay.poll() is None and time.monotonic() < deadline:
            for i in range(len(cluster.nodes)):
                ranks = [p for p in cluster.pids(i) if i not in seen and "LOCAL_RANK" in environ_of(p)
                         and environ_of(p).get("QWEN_TUI_RUN_ID")]  # the run's ranks (the rehearsal's carry no id)
                if not ranks:
                    continue
                pid, run_id = ranks[0], environ_of(ranks[0])["QWEN_TUI_RUN_ID"]
                cgroup = Path(f"/proc/{pid}/cgroup").read_text()  # read first: the rank may end
                net = os.readlink(f"/proc/{pid}/ns/net")
                r = nodes.podman(i, "inspect", "--format", "{{.Id}}", container_name(run_id, i))
                assert r.returncode == 0, r.stderr
                assert f"libpod-{r.stdout.strip()}" in cgroup, (i, cgroup)  # the rank's cgroup is its container's
                assert net == os.readlink(f"/proc/{nodes.init_pid(i)}/ns/net")  # on the node's own network
                seen[i] = r.stdout.strip()
            time.sleep(0.2)
        code = replay.wait(timeout=max(30.0, deadline - time.monotonic()))
    finally:
        if replay.poll() is None:
            os.killpg(replay.pid, 9)
            replay.wait(timeout=30)
    text = log.read_text(errors="replace")
    assert code == 0, text[-5000:]
    assert sorted(seen) == [0, 1, 2] and len(set(seen.values())) == 3, (seen, text[-3000:])
    job = re.search(r"inside SLURM job (\d+): 3 node\(s\), node0, node1, node2", text)
    assert job, text[-3000:]
    for i in range(3):  # probed through srun, inside the image (the container check passed on every node)
        assert f"probe: node {i} (node{i}): probed" in text
    assert "training finished on every node" in text
    first, last = map(float, re.search(r"loss ([0-9.]+) -> ([0-9.]+) over", text).groups())
    assert last < first, (first, last)
    assert "JobState=COMPLETED" in slurm.completion(job.group(1))
    assert _left(cluster, podman) == {}
