"""Sync of directories from the master (a model directory, the project's training code) and
`qwen-tui check --sync` as users run it, on the namespace cluster. The nodes share this machine's
filesystem except their homes: everything synced here lives in the nodes' homes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from qwen_tui.nodes.checks.runner import run_checks
from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.nodes.sync import sync
from qwen_tui.preset.schema import Preset
from support.cluster import REPO, preset_dict


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _model(root: Path) -> dict[str, bytes]:
    """A model directory: config, a 3 MB weight file (several SFTP windows), a nested tokenizer dir."""
    files = {"config.json": b'{"model_type": "qwen2", "hidden_size": 64}\n',
             "model.safetensors": os.urandom(3 << 20),
             "tokenizer/tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}\n',
             "tokenizer/special_tokens_map.json": b'{"eos_token": "<|im_end|>"}\n'}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _codes(rep, kind):
    return {(f.node, f.code) for f in rep.errors if f.code.startswith(kind)}


def test_a_model_directory_is_copied_where_missing_and_replaced_file_by_file_only_with_consent(
        cluster, sshdir, keyed):
    rel = "qt-syncdir/model"
    homes = [n.home for n in cluster.nodes]
    for h in homes:
        shutil.rmtree(h / "qt-syncdir", ignore_errors=True)
    want = _model(homes[0] / rel)
    # node2: an older copy, one file changed and one missing
    (homes[2] / rel).mkdir(parents=True)
    shutil.copy(homes[0] / rel / "model.safetensors", homes[2] / rel / "model.safetensors")
    (homes[2] / rel / "config.json").write_bytes(b'{"model_type": "qwen2", "hidden_size": 32}\n')
    before2 = _tree(homes[2] / rel)

    preset = Preset.model_validate(preset_dict(cluster, sshdir, model=f"~/{rel}"))
    conns = connect_all(preset)
    assert conns.ok, conns.errors_text()
    try:
        rep = run_checks(preset, dict(conns), network=False)
        assert _codes(rep, "MODEL") == {(1, "MODEL_MISSING"), (2, "MODEL_DIFFERS")}

        seen: list[tuple[int, str]] = []
        res = sync(preset, dict(conns), rep.facts, code=False,
                   progress=lambda n, p, done, total: seen.append((n, p)) if done == total else None)
        assert res.ok, res.errors_text()
        (a1,), (a2,) = res[1], res[2]
        assert (a1.kind, a1.action) == ("model", "copied") and "sha256 verified" in a1.detail
        assert _tree(homes[1] / rel) == want
        assert a2.action == "differs (left untouched)" and "--overwrite" in a2.detail
        assert _tree(homes[2] / rel) == before2
        assert {n for n, _ in seen} == {1}

        seen.clear()
        res = sync(preset, dict(conns), rep.facts, code=False, overwrite=True,
                   progress=lambda n, p, done, total: seen.append((n, p)) if done == total else None)
        assert res.ok and [a.action for a in res[2]] == ["copied"] and [a.action for a in res[1]] == ["same"]
        assert _tree(homes[2] / rel) == want
        # only what differed went over the wire; the 3 MB file node2 already had stayed put
        assert sorted(os.path.relpath(p, str(homes[2] / rel)) for n, p in seen) == \
            ["config.json", "tokenizer/special_tokens_map.json", "tokenizer/tokenizer.json"]

        again = run_checks(preset, dict(conns), network=False)
        assert _codes(again, "MODEL") == set()
        assert {again.facts.nodes[i].model.sha256 for i in range(3)} == {rep.facts.nodes[0].model.sha256}
    finally:
        close_all(conns)
        for h in homes:
            shutil.rmtree(h / "qt-syncdir", ignore_errors=True)


def test_an_extra_file_on_the_node_fails_the_sync_naming_it_and_stays(cluster, sshdir, keyed):
    rel = "qt-syncextra/model"
    homes = [n.home for n in cluster.nodes]
    for h in homes:
        shutil.rmtree(h / "qt-syncextra", ignore_errors=True)
    _model(homes[0] / rel)
    _model(homes[1] / rel)
    (homes[1] / rel / "model.safetensors").write_bytes(b"old weights")
    (homes[1] / rel / "stale-adapter.bin").write_bytes(b"x")
    preset = Preset.model_validate(preset_dict(cluster, sshdir, model=f"~/{rel}"))
    conns = connect_all(preset)
    try:
        rep = run_checks(preset, dict(conns), network=False)
        res = sync(preset, dict(conns), rep.facts, code=False, overwrite=True)
        (a1,) = res[1]
        assert a1.action == "failed" and "stale-adapter.bin" in a1.detail, a1
        assert (homes[1] / rel / "stale-adapter.bin").exists()  # never deleted: not the master's to judge
        assert (homes[1] / rel / "model.safetensors").read_bytes() == (homes[0] / rel / "model.safetensors").read_bytes()
    finally:
        close_all(conns)
        for h in homes:
            shutil.rmtree(h / "qt-syncextra", ignore_errors=True)


def test_the_training_code_is_copied_to_a_node_whose_workdir_is_missing(cluster, sshdir, keyed):
    home1 = cluster.nodes[1].home
    shutil.rmtree(home1 / "qt-code", ignore_errors=True)
    d = preset_dict(cluster, sshdir)
    d["cluster"]["nodes"][1]["workdir"] = "~/qt-code"
    preset = Preset.model_validate(d)
    conns = connect_all(preset)
    try:
        rep = run_checks(preset, dict(conns), network=False)
        assert (1, "WORKDIR_MISSING") in {(f.node, f.code) for f in rep.errors}  # its fix: check --sync
        res = sync(preset, dict(conns), rep.facts)
        assert res.ok, res.errors_text()
        code = {a.kind: a for a in res[1]}["code"]
        assert code.action == "copied" and code.path == str(home1 / "qt-code" / "training")
        assert {a.kind: a.action for a in res[2]}["code"] == "same"  # node2's workdir is the master's checkout
        copied = _tree(home1 / "qt-code" / "training")
        assert copied["finetune.py"] == (REPO / "training" / "finetune.py").read_bytes()
        assert not any("__pycache__" in k or k.endswith(".pyc") for k in copied)
        again = run_checks(preset, dict(conns), network=False)
        assert again.verdict(1, "code") == "ok" and again.facts.nodes[1].training_importable
    finally:
        close_all(conns)
        shutil.rmtree(home1 / "qt-code", ignore_errors=True)


def _cli(*args, timeout=300):
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "qwen_tui.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def test_check_sync_copies_what_is_missing_and_replaces_what_differs_only_with_overwrite(
        cluster, sshdir, keyed, tmp_path):
    rel = "qt-clisync"
    homes = [n.home for n in cluster.nodes]
    for h in homes:
        shutil.rmtree(h / rel, ignore_errors=True)
    data = b"".join(b'{"messages": [{"role": "user", "content": "q%d"}, {"role": "assistant", "content": "a"}]}\n' % i
                    for i in range(500))
    (homes[0] / rel).mkdir()
    (homes[0] / rel / "chat.jsonl").write_bytes(data)
    want = _model(homes[0] / rel / "model")
    (homes[2] / rel).mkdir()
    (homes[2] / rel / "chat.jsonl").write_bytes(b'{"messages": []}\n')
    p = tmp_path / "sync.yaml"
    d = preset_dict(cluster, sshdir, data=f"~/{rel}/chat.jsonl", model=f"~/{rel}/model",
                    output_dir=str(tmp_path / "out"))
    d["cluster"]["shared_storage"] = True
    p.write_text(yaml.safe_dump(d))
    try:
        out = tmp_path / "check.json"
        r = _cli("check", str(p), "--sync", "--no-rehearsal", "--bandwidth-seconds", "1", "--json",
                 "--out", str(out))
        assert "sync node1 data: copied" in r.stderr and "sync node1 model: copied" in r.stderr, r.stderr
        assert "sync node2 data: differs (left untouched)" in r.stderr and "sync node2 model: copied" in r.stderr
        rep = json.loads(out.read_text())
        # the checks after the sync: node1 complete; node2's data still differs, so check fails
        assert r.returncode == 1
        assert [(f["node"], f["code"]) for f in rep["findings"] if f["level"] == "error"] == [(2, "DATA_DIFFERS")]
        assert (homes[1] / rel / "chat.jsonl").read_bytes() == data and _tree(homes[1] / rel / "model") == want
        assert (homes[2] / rel / "chat.jsonl").read_bytes() == b'{"messages": []}\n'

        r = _cli("check", str(p), "--sync", "--overwrite", "--no-rehearsal", "--bandwidth-seconds", "1")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "sync node2 data: copied" in r.stdout and "sync node1 data: same" in r.stdout
        assert (homes[2] / rel / "chat.jsonl").read_bytes() == data
    finally:
        for h in homes:
            shutil.rmtree(h / rel, ignore_errors=True)
