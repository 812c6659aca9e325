"""SFTP copies to a node never write through a planted link (`check --sync` copies
data this way): the temp name is fresh and opened with O_CREAT|O_EXCL."""

from __future__ import annotations

import os

from qwen_tui.nodes.connect import close_all, connect_all
from qwen_tui.preset.schema import Preset
from support.cluster import preset_dict


def test_sftp_put_never_writes_through_a_planted_part_link(cluster, sshdir, keyed, tmp_path):
    preset = Preset.model_validate(preset_dict(cluster, sshdir))
    conns = connect_all(preset)
    assert conns.ok, conns.errors_text()
    try:
        src = tmp_path / "chat.jsonl"
        src.write_text("new data\n")
        dst_dir = tmp_path / "node-side"
        dst_dir.mkdir()
        victim = tmp_path / "victim"
        victim.write_text("precious\n")
        for name in ("chat.jsonl.part", ".chat.jsonl.part"):
            (dst_dir / name).symlink_to(victim)
        conns[1].put_file(str(src), str(dst_dir / "chat.jsonl"))
        assert victim.read_text() == "precious\n"
        assert (dst_dir / "chat.jsonl").read_text() == "new data\n"
        assert not [n for n in os.listdir(dst_dir) if n.endswith(".part") and not os.path.islink(dst_dir / n)]
    finally:
        close_all(conns)
