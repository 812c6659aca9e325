"""A Hugging Face hub cache made offline: a model directory's files laid out as huggingface_hub stores a snapshot
(blobs by SHA-256, the snapshot's files as relative links, refs/main). Shared by the hub-model tests."""

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(cache: Path, repo: str, src: Path, kind: str = "model") -> Path:
    """`src`'s files as a snapshot of `repo` (a model, or kind "dataset") in the hub cache `cache`; returns the
    snapshot directory (its repo directory is snapshot.parents[1])."""
    base = cache / (f"{kind}s--" + repo.replace("/", "--"))
    snap = base / "snapshots" / COMMIT
    (base / "blobs").mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(COMMIT)
    for f in sorted(src.rglob("*")):
        if f.is_file():
            data = f.read_bytes()
            blob = base / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            link = snap / f.relative_to(src)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    return snap
