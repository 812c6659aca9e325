"""Is the output directory one filesystem on every node? Measured, not assumed.

The master writes a marker with a random token into `training.output_dir` (or its
nearest existing parent: a check creates no directory); every other node reads it
back from the same path. Shared storage decides who saves
checkpoints: rank 0 alone (shared), or every node (not shared). Getting it wrong
either loses checkpoints on the nodes that cannot see them or makes every node write
the same files.
"""

from __future__ import annotations

import posixpath
import secrets

from ...preset.schema import Preset
from ..programs import program
from ..results import on_nodes
from ..transport.protocol import Transport

# Writes the token into NAME in DIR or, when DIR does not exist yet, in its nearest
# existing parent (the filesystem DIR will be made on): a check creates no directory.
# Prints the directory used. argv stays data, never shell text.
_WRITE = program("write_marker.sh")


def detect_shared_storage(preset: Preset, transports: dict[int, Transport], *,
                          timeout: float = 20.0) -> bool | None:
    """True when every node sees the master's marker, False when one does not, None
    when it could not be told (fewer than two nodes reachable, the master cannot write)."""
    nodes = preset.cluster.nodes
    others = [i for i in transports if i != 0]
    if 0 not in transports or not others:
        return None
    out = preset.training.output_dir
    token = secrets.token_hex(12)
    name = f".qwen-tui-shared-{token[:8]}"
    wrote = transports[0].run(["sh", "-c", _WRITE, "sh", out, token, name], timeout=timeout, cwd=nodes[0].workdir)
    if not wrote.ok or not wrote.stdout:
        return None
    marker = posixpath.join(wrote.stdout, name)
    try:
        seen = on_nodes(lambda i: transports[i].run(["cat", "--", marker], timeout=timeout, cwd=nodes[i].workdir),
                        others, timeout=timeout + 5)
        verdicts = []
        for i in others:
            r = seen.get(i)
            if isinstance(r, BaseException) or r is None:
                return None  # that node did not answer: no verdict rather than a wrong one
            verdicts.append(r.ok and r.stdout == token)
        return all(verdicts)
    finally:
        transports[0].run(["rm", "-f", "--", marker], timeout=timeout, cwd=nodes[0].workdir)
