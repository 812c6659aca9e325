"""Sync from the master: missing -> copied and verified; different -> untouched without consent."""

from __future__ import annotations

import hashlib

from qwen_tui.nodes.checks.runner import run_checks
from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.nodes.sync import sync
from qwen_tui.preset.schema import Preset
from support.cluster import preset_dict


def test_sync_copies_missing_data_and_leaves_a_different_file_alone(cluster, sshdir, keyed):
    data = b"".join(b'{"messages": [{"role": "user", "content": "hi %d"}]}\n' % i for i in range(20000))
    other = b'{"messages": []}\n'
    rel = "qt-sync/chat.jsonl"
    (cluster.nodes[0].home / "qt-sync").mkdir(exist_ok=True)
    (cluster.nodes[0].home / rel).write_bytes(data)
    (cluster.nodes[2].home / "qt-sync").mkdir(exist_ok=True)
    (cluster.nodes[2].home / rel).write_bytes(other)
    assert not (cluster.nodes[1].home / rel).exists()

    preset = Preset.model_validate(preset_dict(cluster, sshdir, data=f"~/{rel}"))
    conns = connect_all(preset)
    assert conns.ok
    try:
        rep = run_checks(preset, dict(conns), network=False)
        codes = {(f.node, f.code) for f in rep.errors}
        assert (1, "DATA_MISSING") in codes and (2, "DATA_DIFFERS") in codes and 0 not in {n for n, _ in codes}
        assert rep.verdict(1, "data") == "error" and rep.verdict(0, "data") == "ok"

        seen = []
        res = sync(preset, dict(conns), rep.facts, progress=lambda n, p, done, total: seen.append((n, done, total)))
        assert res.ok, res.errors_text()
        act1 = {a.kind: a for a in res[1]}
        act2 = {a.kind: a for a in res[2]}
        assert act1["data"].action == "copied" and "sha256 verified" in act1["data"].detail
        assert (cluster.nodes[1].home / rel).read_bytes() == data
        assert act2["data"].action.startswith("differs") and (cluster.nodes[2].home / rel).read_bytes() == other
        assert act1["code"].action == "same"  # the project's training code: same files on every node
        assert seen and seen[-1] == (1, len(data), len(data))

        again = run_checks(preset, dict(conns), network=False)
        assert rep.facts.nodes[0].data.sha256 == hashlib.sha256(data).hexdigest()
        assert again.facts.nodes[1].data.sha256 == rep.facts.nodes[0].data.sha256
        assert {(f.node, f.code) for f in again.errors} == {(2, "DATA_DIFFERS")}

        # with consent, the different file is replaced and verified
        res = sync(preset, dict(conns), again.facts, overwrite=True, code=False)
        assert {a.kind: a.action for a in res[2]} == {"data": "copied"}
        assert (cluster.nodes[2].home / rel).read_bytes() == data
    finally:
        close_all(conns)
