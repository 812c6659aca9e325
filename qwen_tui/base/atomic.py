"""Write a file whole or not at all, never through a planted link.

The temp file is made by mkstemp in the target's directory (O_CREAT|O_EXCL: a
name someone planted, link or not, is never opened), then renamed over the
target. The rename replaces a link at the target itself; it never writes into
what the link points to.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> Path:
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return p
