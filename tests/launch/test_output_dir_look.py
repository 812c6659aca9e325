"""The wizard's look at node 0's output directory before a launch (run.api.look_at_output_dir), on this machine's
real transport and a real unreachable node: what the directory holds, nothing for an empty or missing one, and
why it could not be looked at; and master_transport, the wizard's choice of node 0's transport."""

from __future__ import annotations

import socket
import sys

from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.nodes.transport.ssh import SSHTarget, SSHTransport
from qwen_tui.run import api
from support.launch_api import demo
from support.paths import ROOT


def look(preset, transport):
    return api.look_at_output_dir(preset, transport, base_dir=str(ROOT), local_python=sys.executable)


def test_a_directory_with_a_checkpoint_shows_its_entries(tmp_path):
    p = demo(tmp_path)
    (tmp_path / "out" / "checkpoint-20").mkdir(parents=True)
    (tmp_path / "out" / "adapter_model.safetensors").write_bytes(b"x")
    out, entries, why = look(p, LocalTransport())
    assert out == str(tmp_path / "out") and why == ""
    assert sorted(entries) == ["adapter_model.safetensors", "checkpoint-20"]


def test_an_empty_or_missing_directory_holds_nothing(tmp_path):
    p = demo(tmp_path)
    assert look(p, LocalTransport()) == (str(tmp_path / "out"), [], "")  # missing
    (tmp_path / "out").mkdir()
    assert look(p, LocalTransport()) == (str(tmp_path / "out"), [], "")  # empty


def test_a_resumed_run_is_not_looked_at(tmp_path):
    p = demo(tmp_path, resume_from_checkpoint="auto")
    (tmp_path / "out" / "checkpoint-20").mkdir(parents=True)
    assert look(p, LocalTransport()) == (None, None, "")


def test_an_unreachable_or_unconnected_node_says_why(tmp_path):
    p = demo(tmp_path)
    assert look(p, None) == (str(tmp_path / "out"), None, "node 0 is not connected yet")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: the node does not answer
    t = SSHTransport(SSHTarget("node0", "127.0.0.1", port=port, connect_timeout=3, known_hosts=str(tmp_path / "kh"),
                               look_for_keys=False))
    try:
        out, entries, why = look(p, t)
    finally:
        t.close()
    assert out == str(tmp_path / "out") and entries is None
    assert why.startswith(f"node0: cannot reach 127.0.0.1:{port}"), why


def test_node_0_on_this_machine_needs_no_connection(tmp_path):
    p = demo(tmp_path)
    conns = api.Connections()
    assert p.cluster.nodes[0].is_local and isinstance(api.master_transport(p, conns), LocalTransport)
    remote = p.with_changes({"cluster.nodes.0.host": "node0.invalid"})
    assert not remote.cluster.nodes[0].is_local and api.master_transport(remote, conns) is None
