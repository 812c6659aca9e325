"""Hub models downloaded once (qwen_tui/nodes/hubmodel.py) and digests hashed once (qwen_tui/nodes/remote/digests.py).

There is no hub here: the tests pre-populate a hub cache in huggingface_hub's own layout (blobs, refs/main,
snapshots/<commit> of links) with the tiny model and run with HF_HUB_OFFLINE=1, so snapshot_download resolves
the id from the cache as it would on an offline cluster. A download over the network (HF_ENDPOINT) is not
exercised."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from qwen_tui.nodes.checks.probe import probe_node
from qwen_tui.nodes.hubmodel import download_on_master, hf_env, hub_id, synced_rel
from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.preset.schema import Preset
from support.fakehub import fake_hub_cache


@pytest.fixture
def tiny_src(tiny_model) -> Path:
    return tiny_model  # the session's tiny model (tests/conftest.py)


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN_TUI_CACHE", str(tmp_path / "qt-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return tmp_path


def _preset(workdir: Path, model: str, data: str = "builtin:demo-chat", **network_env) -> Preset:
    return Preset.model_validate({
        "cluster": {"nodes": [{"host": "localhost", "gpus": 1, "workdir": str(workdir), "python": sys.executable}]},
        "network": {"env": network_env},
        "training": {"model": model, "data": data, "device": "cpu", "output_dir": str(workdir / "out")}})


def test_hub_ids_are_told_from_paths():
    assert hub_id("Qwen/Qwen2.5-7B-Instruct") and hub_id("acme/tiny.v2")
    assert not any(hub_id(s) for s in ("./a/b", "/m/x", "~/m", "builtin:tiny", "a/b/c", "tiny"))
    assert synced_rel("Qwen/Qwen2.5-7B") == ".qwen-tui/models/Qwen--Qwen2.5-7B"


def test_the_probe_finds_a_hub_id_in_the_cache_and_hashes_it_once(env, tiny_src):
    snap = fake_hub_cache(env / "hub", "acme/tiny", tiny_src)
    work = env / "work"
    work.mkdir()
    t = LocalTransport("node0")
    facts, raw = probe_node(t, _preset(work, "acme/tiny"), 0)
    assert facts.model is not None and facts.model.exists and facts.model.path == str(snap)
    n_files = len([f for f in tiny_src.rglob("*") if f.is_file()])
    assert raw["digest_cache"] == {"computed": n_files, "reused": 0, "error": None}
    again, raw2 = probe_node(t, _preset(work, "acme/tiny"), 0)
    assert raw2["digest_cache"] == {"computed": 0, "reused": n_files, "error": None}
    assert again.model.sha256 == facts.model.sha256
    # the digest is keyed by size, mtime and inode: a rewritten file is hashed again, and the total changes
    cfg = tiny_src / "config.json"
    blob = Path(os.path.realpath(snap / "config.json"))
    blob.write_bytes(cfg.read_bytes().replace(b"}", b', "x": 1}', 1))
    changed, raw3 = probe_node(t, _preset(work, "acme/tiny"), 0)
    assert raw3["digest_cache"]["computed"] == 1 and changed.model.sha256 != facts.model.sha256


def test_a_digest_kept_for_an_unchanged_file_is_used_as_is(env, tmp_path):
    # proves the probe trusts the cache for an unchanged file instead of reading it again
    data = tmp_path / "chat.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    work = tmp_path / "w"
    work.mkdir()
    t = LocalTransport("node0")
    first, _ = probe_node(t, _preset(work, "builtin:tiny", data=str(data)), 0)
    assert first.data.sha256 == hashlib.sha256(data.read_bytes()).hexdigest()
    cache = tmp_path / "qt-cache" / "digests.json"
    kept = json.loads(cache.read_text())
    kept[str(data.resolve())][3] = "f" * 64
    cache.write_text(json.dumps(kept))
    second, _ = probe_node(t, _preset(work, "builtin:tiny", data=str(data)), 0)
    assert second.data.sha256 == "f" * 64


def test_the_master_downloads_into_its_workdir_once_offline_from_the_cache(env, tiny_src):
    snap = fake_hub_cache(env / "hub", "acme/tiny", tiny_src)
    work = env / "work"
    work.mkdir()
    t = LocalTransport("node0")
    p = _preset(work, "acme/tiny")
    action, path, detail = download_on_master(p, t, python=sys.executable)
    dest = work / ".qwen-tui" / "models" / "acme--tiny"
    assert action == "downloaded" and path == str(dest), detail
    assert str(snap) in detail and "files linked" in detail
    for f in tiny_src.rglob("*"):
        if f.is_file():
            got = dest / f.relative_to(tiny_src)
            assert not got.is_symlink() and got.read_bytes() == f.read_bytes()
    assert not (work / ".qwen-tui" / "models" / "acme--tiny.partial").exists()
    assert download_on_master(p, t, python=sys.executable)[0] == "already there"
    # the probe now reports the synced copy, with the snapshot's digest
    facts, _ = probe_node(t, p, 0)
    assert facts.model.path == str(dest)
    shutil.rmtree(dest)
    from_cache, _ = probe_node(t, p, 0)
    assert from_cache.model.path == str(snap) and from_cache.model.sha256 == facts.model.sha256


def test_an_id_missing_from_the_offline_cache_fails_with_the_reason(env):
    work = env / "work"
    work.mkdir()
    action, _, detail = download_on_master(_preset(work, "acme/absent"), LocalTransport("node0"),
                                           python=sys.executable)
    assert action == "failed" and "acme/absent on node 0" in detail and "LocalEntryNotFoundError" in detail
    assert not (work / ".qwen-tui" / "models").exists() or not any((work / ".qwen-tui" / "models").iterdir())


def test_hf_settings_come_from_the_preset_over_qwen_tuis_and_the_token_stays_out_of_env():
    env, token = hf_env({"HF_ENDPOINT": "https://mirror.example", "HF_TOKEN": "hf_secret", "OTHER": "x"},
                        {"HF_ENDPOINT": "https://hub.example", "HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_own"})
    assert env == {"HF_ENDPOINT": "https://mirror.example", "HF_HUB_OFFLINE": "1"} and token == "hf_secret"


def test_the_worker_loads_the_synced_copy_of_a_hub_id(tmp_path, monkeypatch, tiny_src):
    from training.model.pretrained import resolve_model_source

    monkeypatch.chdir(tmp_path)
    assert resolve_model_source("acme/tiny", 0) == "acme/tiny"  # nothing synced: the hub (or its cache) decides
    shutil.copytree(tiny_src, tmp_path / ".qwen-tui" / "models" / "acme--tiny")
    assert resolve_model_source("acme/tiny", 0) == str(tmp_path / ".qwen-tui" / "models" / "acme--tiny")


def test_a_hub_data_set_is_downloaded_once_on_the_master_synced_and_read_by_the_worker(env, tmp_path, monkeypatch):
    """hf:ORG/NAME as a preset's data: `check --sync`'s steps, the master's download (offline, from its hub cache)
    into .qwen-tui/datasets, the checksum-verified copy to another node's workdir, and the worker reading it there
    (a Parquet file, as data sets on the hub are stored)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from qwen_tui.cluster.facts import ClusterFacts
    from qwen_tui.nodes.hubmodel import hub_datasets
    from qwen_tui.nodes.sync import sync
    from training.data.records import load_conversations

    src = tmp_path / "ds-src" / "data"
    src.mkdir(parents=True)
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), src / "train-00000-of-00001.parquet")
    fake_hub_cache(env / "hub", "acme/chat", src.parent, kind="dataset")
    works = [env / "w0", env / "w1"]
    for w in works:
        w.mkdir()
    preset = Preset.model_validate({
        "cluster": {"nodes": [{"host": "localhost", "workdir": str(w), "python": sys.executable} for w in works]},
        "training": {"model": "builtin:tiny", "data": "hf:acme/chat", "device": "cpu"}})
    assert hub_datasets(preset) == ["acme/chat"]
    t0, t1 = LocalTransport("node0"), LocalTransport("node1")
    action, path, detail = download_on_master(preset, t0, python=sys.executable, dataset="acme/chat")
    assert action == "downloaded" and path == str(works[0] / ".qwen-tui" / "datasets" / "acme--chat"), detail
    assert download_on_master(preset, t0, python=sys.executable, dataset="acme/chat")[0] == "already there"
    res = sync(preset, {0: t0, 1: t1}, ClusterFacts(nodes={}), code=False)
    (act,) = res[1]
    assert (act.kind, act.action) == ("dataset acme/chat", "copied"), act
    monkeypatch.chdir(works[1])
    convs = load_conversations("hf:acme/chat")
    assert [c.messages[1]["content"] for c in convs] == [f"a{i}" for i in range(5)]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="hf:acme/chat: not on this node .* `qwen-tui check --sync` downloads"):
        load_conversations("hf:acme/chat")
