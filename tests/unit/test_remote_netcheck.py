"""The port check's two programs (qwen_tui/nodes/remote/port_listen.py, port_connect.py), run with the plain
system python3 on this machine's loopback: the listener binds, says READY, counts its peers; the connector
reports each target as reached, refused or timed out, within its bounds."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time

from qwen_tui.nodes.programs import program

NODE_PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def connect(targets, window=5.0, probe=1.0) -> dict:
    r = subprocess.run([NODE_PY, "-c", program("port_connect.py"),
                        json.dumps({"targets": targets, "window": window, "probe": probe})],
                       capture_output=True, text=True, timeout=window + 15)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def line_reader(p: subprocess.Popen) -> queue.Queue:
    """The process's stdout lines as they come (a thread reads them; each get below has its bound)."""
    q: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [q.put(ln) for ln in p.stdout], daemon=True).start()
    return q


def test_listener_and_connector_meet_and_a_busy_port_is_named():
    a, b, closed = free_ports(3)
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen(1)
    taken = busy.getsockname()[1]
    p = subprocess.Popen([NODE_PY, "-c", program("port_listen.py"),
                          json.dumps({"ports": [a, b, taken], "window": 20, "expect": 1})],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = line_reader(p)
    try:
        first = json.loads(lines.get(timeout=10))
        assert first["bound"][str(a)] is None and first["bound"][str(b)] is None
        assert "in use" in first["bound"][str(taken)].lower()
        assert lines.get(timeout=5).strip() == "READY"
        t0 = time.monotonic()
        res = connect([["127.0.0.1", a], ["127.0.0.1", b], ["127.0.0.1", closed]], window=5, probe=0.5)
        assert res == {f"127.0.0.1:{a}": None, f"127.0.0.1:{b}": None, f"127.0.0.1:{closed}": "connection refused"}
        p.wait(timeout=10)  # every bound port heard from its one peer: it ends long before its window
        assert time.monotonic() - t0 < 10
        last = json.loads(lines.get(timeout=5))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=5)
        busy.close()
    assert p.returncode == 0, p.stderr.read()
    assert last["peers"] == {str(a): ["127.0.0.1"], str(b): ["127.0.0.1"]}


def test_a_dropped_connect_times_out_within_its_probe_and_the_window_leaves_the_rest_untried():
    # a backlog-full listener that never accepts stands in for a firewall that drops the SYN
    port, other = free_ports(2)
    silent = socket.socket()
    silent.bind(("127.0.0.1", port))
    silent.listen(0)
    fillers = []
    try:
        for _ in range(8):  # fill the accept queue: later SYNs go unanswered
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            fillers.append(c)
        time.sleep(0.2)
        t0 = time.monotonic()
        res = connect([["127.0.0.1", port], ["127.0.0.1", other]], window=1.0, probe=1.0)
        took = time.monotonic() - t0
    finally:
        for c in fillers:
            c.close()
        silent.close()
    assert res == {f"127.0.0.1:{port}": "timed out after 1s (packets dropped: a firewall?)"}  # the 2nd: no time left
    assert took < 5
