"""An SSH transport whose commands run through `sh` on this machine: the node-side scripts (job start, process
listing, checked kill) are the real ones; only the SSH channel is left out."""

from pathlib import Path

from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.nodes.transport.ssh import SSHTarget, SSHTransport


class ShellHere(SSHTransport):
    """SSHTransport whose commands run through `sh` on this machine instead of an SSH channel:
    the job start, process listing and checked kill scripts are the real ones."""

    def __init__(self, home: Path):
        super().__init__(SSHTarget(label="here", hostname="127.0.0.1"))
        self._home = str(home)

    def run(self, argv, *, timeout, input=None, env=None, cwd=None):
        return LocalTransport().run(argv, timeout=timeout, input=input, env=env, cwd=cwd)
