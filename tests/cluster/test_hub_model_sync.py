"""A hub model downloaded once, on two namespace nodes with their own homes and workdirs, offline.

Only node 0's hub cache holds `acme/tiny` (huggingface_hub's layout, pre-populated: there is no hub here, so
HF_HUB_OFFLINE=1 and snapshot_download resolves the id from that cache). `qwen-tui check --sync` has the master
lay it out in its workdir and copies it to node 1, checksum verified; a run then trains on both nodes, and
node 1, which has no hub cache and no network to the hub, can only have loaded the synced copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import yaml

from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.plan.launch import make_plan
from qwen_tui.preset.schema import Preset
from qwen_tui.run.launcher import Launcher
from qwen_tui.run.rundir import RunDir
from support.cluster import REPO, preset_dict
from support.fakehub import fake_hub_cache


def test_the_master_downloads_once_and_the_sync_serves_the_other_node(cluster, sshdir, keyed, tmp_path,
                                                                      tiny_model):
    src = tiny_model
    hub0 = cluster.nodes[0].home / ".cache" / "huggingface" / "hub"
    made = fake_hub_cache(hub0, "acme/tiny", src).parents[1]
    work = []
    for i in range(2):
        w = tmp_path / f"node{i}-work"
        w.mkdir()
        (w / "training").symlink_to(REPO / "training")
        work.append(w)
    d = preset_dict(cluster, sshdir, model="acme/tiny", output_dir="out", max_steps=2)
    d["cluster"]["nodes"] = d["cluster"]["nodes"][:2]
    for n, w in zip(d["cluster"]["nodes"], work):
        n["workdir"] = str(w)
    d["cluster"]["shared_storage"] = False
    d["network"]["env"] = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = tmp_path / "hub.yaml"
    p.write_text(yaml.safe_dump(d))
    try:
        r = subprocess.run([sys.executable, "-m", "qwen_tui.cli", "check", str(p), "--sync", "--json",
                            "--no-rehearsal", "--bandwidth-seconds", "1"], capture_output=True, text=True,
                           timeout=600, cwd=REPO, env={**os.environ, "COLUMNS": "250"})
        data = json.loads(r.stdout)
        assert r.returncode == 0, ([f for f in data["findings"] if f["level"] == "error"], r.stderr[-3000:])
        assert "download node0 model: downloaded" in r.stderr and "files linked" in r.stderr, r.stderr[-2000:]
        synced = [w / ".qwen-tui" / "models" / "acme--tiny" for w in work]
        for f in src.rglob("*"):
            if f.is_file():
                for s in synced:
                    assert (s / f.relative_to(src)).read_bytes() == f.read_bytes(), (s, f)
        m0, m1 = data["facts"]["nodes"]["0"]["model"], data["facts"]["nodes"]["1"]["model"]
        assert m0["path"] == str(synced[0]) and m1["path"] == str(synced[1]), (m0, m1)
        assert m0["sha256"] == m1["sha256"]
        assert not (cluster.nodes[1].home / ".cache" / "huggingface").exists()  # node 1 never downloaded

        preset = Preset.model_validate(d)
        conns = connect_all(preset)
        assert conns.ok, conns.errors_text()
        la = None
        try:
            rd = RunDir.create(tmp_path / "runs", f"hub-{os.getpid()}")
            plan = make_plan(preset, run_id=rd.path.name, local_run_dir=str(rd.path))
            la = Launcher(plan, dict(conns), rd, stop_grace=5)
            la.start()
            out = la.wait(interval=0.5, max_seconds=300)
            logs = {c.rank: conns[c.rank].read_file(c.log_path).decode(errors="replace") for c in plan.nodes}
            assert out.status == "ok", (out.message, logs)
            assert "acme/tiny: using the synced copy in " + str(synced[0]) in logs[0]
        finally:
            if la is not None:
                la.stop_all()
            close_all(conns)
    finally:
        shutil.rmtree(made, ignore_errors=True)
