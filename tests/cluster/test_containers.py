"""Each node's job in a podman container on the namespace cluster: the demo trains to its end with every rank
inside its node's container, on the node's own network; a stop mid-run leaves no process and no container; the
checks name a node without podman, a node without the image and an image without the worker, before launch.

The image is the one containers/build-image.sh builds from Debian's packages and this checkout's wheel (cached:
.ci/run builds it before the tests; support.podman_nodes builds it if it is missing)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.plan.container import container_name
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.schema import Preset
from qwen_tui.run.launcher import STOP_GRACE_S, Launcher
from qwen_tui.run.rundir import RunDir
from qwen_tui.run.states import RunState
from support.cluster import REPO, preset_dict
from support.launcher_wait import wait_steps
from support.podman_nodes import BUILD_BOUND_S, build_bare_image
from support.procs import assert_quiet_stop_logs, environ_of

# The first test here may build the image (support.podman_nodes.build_image, when .ci/run has not): its bound and
# the test's own.
pytestmark = pytest.mark.timeout(BUILD_BOUND_S + 600)


def _preset(cluster, sshdir, workdir: Path, image: str, nodes: int = 3, **training) -> dict:
    d = preset_dict(cluster, sshdir, **training)
    d["cluster"]["nodes"] = d["cluster"]["nodes"][:nodes]
    workdir.mkdir(exist_ok=True)
    for n in d["cluster"]["nodes"]:
        n["workdir"] = str(workdir)  # not the checkout: the worker that trains is the image's
    d["cluster"]["shared_storage"] = True  # the namespaces share this machine's disk
    d["network"]["interface"] = "eth0"
    # the rendezvous (and the rehearsal's deadline, 30 s past it) with room for three containers' first start on two
    # loaded cores, when the image's files are read from disk the first time after a build
    d["network"]["rdzv_timeout"] = 90
    d["network"]["env"] = {"OMP_NUM_THREADS": "1",  # three CPU "nodes" share two cores
                           "QWEN_TUI_CACHE": os.environ["QWEN_TUI_CACHE"],  # builtin:tiny, built once
                           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # This machine's root lacks CAP_SYS_RESOURCE: no container may get a memlock above the node's hard limit
    # (a CPU run over gloo pins nothing). The default, unlimited, is what the unit tests show.
    d["container"] = {"runtime": "podman", "image": image, "ulimits": {"memlock": "host"}}
    return d


def _launch(preset: Preset, run_id: str, tmp_path: Path, **kw):
    conns = connect_all(preset)
    assert conns.ok, conns.errors_text()
    rd = RunDir.create(tmp_path / "runs", run_id)
    plan = make_plan(preset, run_id=run_id, local_run_dir=str(rd.path))
    la = Launcher(plan, dict(conns), rd, **kw)
    la.start()
    return la, conns


def _no_job_left(cluster, nodes: int, bound: float = 15.0) -> dict:
    deadline = time.monotonic() + bound
    while True:
        left = {i: cluster.job_pids(i) for i in range(nodes)}
        if not any(left.values()) or time.monotonic() > deadline:
            return {i: [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in v if Path(f"/proc/{p}").exists()]
                    for i, v in left.items() if v}
        time.sleep(0.3)


def _cli(*args: str, timeout: float = 300, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "qwen_tui.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO, env={**os.environ, "COLUMNS": "250"}, **kw)


def test_replay_of_the_demo_in_podman_checks_rehearses_and_trains_every_rank_in_its_node_container(
        cluster, sshdir, keyed, podman, tmp_path):
    """As a user runs it: `qwen-tui replay` probes every node inside the image, rehearses there, and trains there
    to the end. While it trains, each rank is looked at from the node: its own cgroup is its node's container's,
    its network is the node's (the node's address among its own), its root is the image's."""
    nodes, tag = podman
    d = _preset(cluster, sshdir, tmp_path / "work", tag, max_steps=24, learning_rate=5e-3)
    del d["network"]["interface"]  # the probe inside the image finds it
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(d))
    runs = tmp_path / "runs"
    replay = _cli("replay", str(path), "--runs-dir", str(runs), "--max-seconds", "300")
    try:
        seen = {}
        deadline = time.monotonic() + 300
        while len(seen) < 3 and replay.poll() is None and time.monotonic() < deadline:
            for i, n in enumerate(cluster.nodes):
                if i in seen:
                    continue
                ranks = [p for p in cluster.pids(i) if "LOCAL_RANK" in environ_of(p)
                         and environ_of(p).get("QWEN_TUI_RUN_ID")]  # the run's ranks (the rehearsal's carry no id)
                if not ranks:
                    continue
                pid, run_id = ranks[0], environ_of(ranks[0])["QWEN_TUI_RUN_ID"]
                r = nodes.podman(i, "inspect", "--format", "{{.Id}}", container_name(run_id, i))
                assert r.returncode == 0, r.stderr
                cid = r.stdout.strip()
                cgroup = Path(f"/proc/{pid}/cgroup").read_text()  # read before anything else: it may end
                net = os.readlink(f"/proc/{pid}/ns/net")
                addrs = Path(f"/proc/{pid}/net/fib_trie").read_text()
                image = (Path(f"/proc/{pid}/root") / "etc" / "qwen-tui-image").read_text()
                assert f"libpod-{cid}" in cgroup, (i, cid, cgroup)
                assert net == os.readlink(f"/proc/{nodes.init_pid(i)}/ns/net") and n.addr in addrs
                assert "key=" in image  # its root is the image's, so its Python and worker are the image's
                seen[i] = cid
            time.sleep(0.2)
        out, _ = replay.communicate(timeout=300)
    finally:
        if replay.poll() is None:
            replay.kill()
            replay.wait(timeout=30)
    assert replay.returncode == 0, out[-5000:]
    assert sorted(seen) == [0, 1, 2] and len(set(seen.values())) == 3, (seen, out[-3000:])
    assert "rehearsal: rendezvous and all-reduce" in out
    first, last = map(float, re.search(r"loss ([0-9.]+) -> ([0-9.]+) over", out).groups())
    assert last < first, (first, last)
    (rd,) = [x for x in runs.iterdir() if x.is_dir()]
    check = json.loads((rd / "check.json").read_text())
    assert check["facts"]["rehearsal_ok"] is True
    assert {row["container"] for row in check["matrix"].values()} == {"ok"}
    infos = [f["message"] for f in check["findings"] if f["code"] == "CONTAINER"]
    assert len(infos) == 3 and all(f"image {tag}: qwen-tui " in m for m in infos), infos
    # the probe ran inside the image: it found podman's marker there
    assert {n["in_container"] for n in check["facts"]["nodes"].values()} == {"/run/.containerenv"}
    plan = json.loads((rd / "plan.json").read_text())
    for c in plan["nodes"]:  # the probe inside the image found the route: ip is in the image
        assert c["env"]["GLOO_SOCKET_IFNAME"] == "eth0" and c["container"][c["container"].index("podman"):][:2] \
            == ["podman", "run"]
    assert _no_job_left(cluster, 3) == {}
    assert {i: nodes.containers(i) for i in range(3)} == {0: [], 1: [], 2: []}


def test_a_stop_mid_run_ends_every_container_and_leaves_no_process(cluster, sshdir, keyed, podman, tmp_path):
    nodes, tag = podman
    preset = Preset.model_validate(_preset(cluster, sshdir, tmp_path / "work", tag, nodes=2, max_steps=100000))
    run_id = f"ctrstop-{os.getpid()}"
    la, conns = _launch(preset, run_id, tmp_path, stop_grace=STOP_GRACE_S)
    try:
        wait_steps(la, 1, 240)
        assert all(nodes.containers(i) == [container_name(run_id, i)] for i in range(2))
        out, left = la.stop_and_record()
        assert out.status == RunState.STOPPED and left == [], out.message
        assert _no_job_left(cluster, 2) == {}  # conmon and the container's processes included
        assert {i: nodes.containers(i) for i in range(2)} == {0: [], 1: []}, (
            [nodes.podman(i, "ps", "-a").stdout for i in range(2)], [la.log_tail(i, 30) for i in range(2)])
        assert_quiet_stop_logs(la.plan)  # the ranks stopped first, then their agents on their own, as on a node
    finally:
        la.stop_all()
        close_all(conns)


def _check(path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    out = path.with_suffix(".json")
    r = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "check", str(path), "--no-rehearsal", "--out",
                        str(out), "--bandwidth-seconds", "1"], capture_output=True, text=True, timeout=300,
                       cwd=REPO, env={**os.environ, "COLUMNS": "250"})
    return r, json.loads(out.read_text())


def test_check_names_the_node_without_podman_and_the_node_without_the_image(cluster, sshdir, keyed, podman,
                                                                            tmp_path):
    nodes, tag = podman
    path = tmp_path / "ctr.yaml"
    path.write_text(yaml.safe_dump(_preset(cluster, sshdir, tmp_path / "work", tag)))
    with nodes.without_podman(1), nodes.without_image(2):
        r, data = _check(path)
    assert r.returncode == 1, r.stdout + r.stderr
    found = {(f["code"], f["node"]): f for f in data["findings"] if f["check"] == "container"}
    runtime = found[("CONTAINER_RUNTIME_MISSING", 1)]
    assert "node1: podman is not installed" in runtime["message"] and "apt-get install podman" in runtime["fix"]
    image = found[("CONTAINER_IMAGE_MISSING", 2)]
    assert f"node2: the image {tag} is not on the node" in image["message"]
    assert f"podman save {tag} | ssh node2 podman load" in image["fix"]
    # node 0 was probed inside the image: the versions that will train
    info = found[("CONTAINER", 0)]
    assert f"image {tag}: qwen-tui " in info["message"] and "torch 2.13.0" in info["message"], info
    assert data["facts"]["nodes"]["0"]["versions"]["qwen-tui"]
    assert data["matrix"]["node0"]["container"] == "ok" and data["matrix"]["node0"]["python"] == "ok"
    assert data["matrix"]["node1"]["container"] == data["matrix"]["node2"]["container"] == "error"
    assert data["matrix"]["node2"]["python"] == "not checked"
    # `qwen-tui check` prints them, node and fix, as it prints every finding
    assert "node1: podman is not installed" in r.stdout and "ssh node2 podman load" in r.stdout, r.stdout
    assert {i: nodes.containers(i) for i in range(3)} == {0: [], 1: [], 2: []}  # the probe's container went


def test_check_names_an_image_without_the_worker(cluster, sshdir, keyed, podman, tmp_path):
    nodes, _ = podman
    bare = build_bare_image()
    path = tmp_path / "bare.yaml"
    path.write_text(yaml.safe_dump(_preset(cluster, sshdir, tmp_path / "work", bare, nodes=1)))
    r, data = _check(path)
    assert r.returncode == 1, r.stdout + r.stderr
    lacks = [f for f in data["findings"] if f["code"] == "IMAGE_LACKS_WORKER"]
    assert [f["node"] for f in lacks] == [0], data["findings"]
    assert f"node0: the image {bare} lacks torch, transformers, peft, accelerate, qwen-tui's worker" \
        in lacks[0]["message"]
    assert "containers/build-image.sh" in lacks[0]["fix"]
    assert not [f for f in data["findings"] if f["code"] in ("TORCH_MISSING", "CODE_MISSING")]
