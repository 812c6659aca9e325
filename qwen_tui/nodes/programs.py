"""The programs qwen-tui runs on the nodes, one file each under remote/: Python (`*.py`) for the node's own
python3, standard library only (rehearsal.py alone imports torch: it runs in the training environment), and sh
scripts (`*.sh`).

Every file opens with a header of `#` lines for the reader: how it is called, what it prints. The node gets the
rest, which `program(name)` returns, as the callers have always sent it:
- a Python program is its parts' text in order (PARTS: the probe and the manifest share the digest cache);
- a shell script is one line, as `sh -c` has always received it: the body's lines, stripped and joined with a
  space (so a line break goes only where a space may, and a body line is never a comment).
The text travels as one argv element (`python3 -c PROGRAM ARGS...`, `sh -c SCRIPT sh ARGS...`), quoted like
every other; what a program works on travels as its arguments, never inside its text.

remote/ has no __init__.py: it is a folder of programs, not a package of modules, so nothing that walks
qwen_tui's modules imports (and runs) them.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

REMOTE = resources.files(__package__).joinpath("remote")
# Programs assembled from parts that define what the last part calls (read_sysfs, sha_file, save_digests).
PARTS: dict[str, tuple[str, ...]] = {
    "probe.py": ("ib_sysfs.py", "digests.py", "probe.py"),
    "manifest.py": ("digests.py", "manifest.py"),
}


def body(name: str) -> str:
    """One file's text after its header of `#` lines."""
    lines = REMOTE.joinpath(name).read_text(encoding="utf-8").splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return "".join(lines[start:])


@cache
def program(name: str) -> str:
    """What goes to the node for `name` (a file in remote/, e.g. "probe.py" or "job.sh")."""
    if name.endswith(".sh"):
        return " ".join(line.strip() for line in body(name).splitlines() if line.strip())
    if name.endswith(".py"):
        return "".join(body(part) for part in PARTS.get(name, (name,)))
    raise ValueError(f"{name}: not a node program (*.py or *.sh)")
