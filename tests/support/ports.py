"""A free TCP port on this machine."""

import socket


def free_port() -> int:
    """A port nothing listens on right now (the kernel's pick for an ephemeral bind on 127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
