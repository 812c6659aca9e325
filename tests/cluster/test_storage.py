"""Shared storage is measured: a marker the master writes into output_dir is read back
on every node, or not. The namespace nodes share this machine's disk, but each logs
in to a home of its own."""

from __future__ import annotations

from qwen_tui.advice.rules import advise
from qwen_tui.cluster.facts import ClusterFacts
from qwen_tui.nodes.checks.storage import detect_shared_storage
from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.preset.schema import Preset
from support.cluster import preset_dict


def _preset(cluster, sshdir, workdir, output_dir, shared):
    d = preset_dict(cluster, sshdir, output_dir=output_dir, save_strategy="steps")
    for n in d["cluster"]["nodes"]:
        n["workdir"] = workdir
    d["cluster"]["shared_storage"] = shared
    return Preset.model_validate(d)


def test_one_disk_is_detected_and_an_undeclared_one_refused(cluster, sshdir, keyed, tmp_path):
    p = _preset(cluster, sshdir, str(tmp_path), "out", shared=False)
    conns = connect_all(p)
    try:
        assert conns.ok, conns.errors_text()
        assert detect_shared_storage(p, dict(conns.succeeded)) is True
    finally:
        close_all(conns)
    # a check creates nothing: no output_dir (the marker went into its existing parent), no marker left
    assert not (tmp_path / "out").exists()
    assert [m.name for m in tmp_path.iterdir() if m.name.startswith(".qwen-tui-shared")] == []
    codes = {a.code for a in advise(p, ClusterFacts(shared_storage=True))}
    assert "SHARED_STORAGE_UNDECLARED" in codes


def test_per_node_homes_are_not_shared(cluster, sshdir, keyed):
    p = _preset(cluster, sshdir, "~", "qwen-tui-storage-probe", shared=True)
    conns = connect_all(p)
    try:
        assert conns.ok, conns.errors_text()
        assert detect_shared_storage(p, dict(conns.succeeded)) is False
    finally:
        close_all(conns)
    assert "NO_SHARED_STORAGE" in {a.code for a in advise(p, ClusterFacts(shared_storage=False))}
