"""The Transport protocol is complete: both transports do all of it, so callers never ask what one can do."""

import os
import typing

from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.nodes.transport.protocol import Transport
from qwen_tui.nodes.transport.ssh import SSHTransport


def protocol_methods() -> set[str]:
    return {n for n, v in vars(Transport).items() if callable(v) and not n.startswith("_")}


def test_both_transports_do_everything_the_protocol_names():
    names = protocol_methods()
    assert {"run", "stream_lines", "abspath", "host_key", "get_file", "put_file", "start_job"} <= names
    for cls in (LocalTransport, SSHTransport):
        missing = [n for n in names if not callable(getattr(cls, n, None))]
        assert not missing, (cls.__name__, missing)
        assert "label" in typing.get_type_hints(Transport)


def test_this_machine_as_a_transport(tmp_path):
    t = LocalTransport()
    assert t.host_key() == ""
    assert t.abspath("~/x") == os.path.join(os.path.expanduser("~"), "x")
    assert t.abspath("rel") == os.path.join(os.getcwd(), "rel")
    (tmp_path / "a").write_bytes(b"weights")
    t.get_file(str(tmp_path / "a"), str(tmp_path / "sub" / "b"))
    assert (tmp_path / "sub" / "b").read_bytes() == b"weights"
