"""The node command server behind a SLURM node's transport (nodes/remote/agent.py and nodes/slurm/agent_link.py),
run here under this machine's Python instead of srun: commands, their bounds, files both ways, streams and their
cancel, many threads on one pipe, and what a caller sees when the server or its job goes away."""

from __future__ import annotations

import base64
import os
import sys
import threading
import time

import pytest

from qwen_tui.nodes.slurm.agent_link import AgentLink
from qwen_tui.nodes.transport.protocol import SessionEnded, TransportError


@pytest.fixture
def link():
    lk = AgentLink("here", [sys.executable], start_bound=30)
    yield lk
    lk.close()


def test_commands_run_with_their_input_environment_directory_and_exit_code(link, tmp_path):
    rc, out, err = link.run(["sh", "-c", 'cat; echo "$QT_X" "$(pwd)" >&2; exit 3'], timeout=10, input=b"in\n",
                            env={"QT_X": "value with spaces"}, cwd=str(tmp_path))
    assert (rc, out, err) == (3, b"in\n", f"value with spaces {tmp_path}\n".encode())
    assert link.run(["no-such-program-qt"], timeout=5)[0] == 127
    assert link.hello["pid"] != os.getpid() and link.hello["home"] == os.path.expanduser("~")


def test_a_command_past_its_bound_is_killed_with_its_children(link, tmp_path):
    marker = tmp_path / "child"
    t0 = time.monotonic()
    rc, _, err = link.run(["sh", "-c", f'sleep 30 & echo $! > {marker}; wait'], timeout=1)
    assert rc == 124 and b"timed out" in err and time.monotonic() - t0 < 10
    child = int(marker.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}"), "the command's child outlived its bound"


def test_files_go_both_ways_whole_and_binary(link, tmp_path):
    data = os.urandom(300_000) + b"\0\n\r"
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    for i, chunk in enumerate((data[:100_000], data[100_000:])):
        link.call("put", 10, path=str(tmp_path / "dst.bin"), data=base64.b64encode(chunk).decode(),
                  first=i == 0, last=i == 1, mode=0o640)
    assert (tmp_path / "dst.bin").read_bytes() == data and (tmp_path / "dst.bin").stat().st_mode & 0o777 == 0o640
    assert not list(tmp_path.glob("*.part")), "the temp file was left behind"
    got = link.call("read", 10, path=str(src), offset=5, limit=7)
    assert base64.b64decode(got["data"]) == data[5:12]
    assert link.call("read", 10, path=str(tmp_path / "missing"), offset=0, limit=10).get("missing") is True


def test_many_threads_share_the_pipe_and_each_gets_its_own_answer(link):
    answers: dict[int, bytes] = {}

    def one(i: int) -> None:
        answers[i] = link.run(["sh", "-c", f"sleep 0.{i % 3}; echo {i}"], timeout=10)[1]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert answers == {i: f"{i}\n".encode() for i in range(12)}


def test_a_stream_yields_lines_as_they_come_and_closing_it_ends_its_command(link, tmp_path):
    marker = tmp_path / "pid"
    stop = threading.Event()
    lines = link.stream(["sh", "-c", f'echo $$ > {marker}; i=0; while true; do echo line$i; i=$((i+1)); sleep 0.1; done'],
                        stop=stop, timeout_first_line=10, idle_timeout=None, poll=0.1)
    got = [next(lines) for _ in range(3)]
    assert got == ["line0", "line1", "line2"]
    lines.close()  # the consumer is done: the command ends
    pid = int(marker.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")


def test_a_server_that_goes_away_fails_every_caller_at_once_and_the_next_call_starts_anew(link):
    first = link.call("hello", 10)["pid"]
    got: list = []

    def waiting() -> None:  # a call in flight when the server dies
        try:
            got.append(link.run(["sleep", "30"], timeout=60))
        except TransportError as e:
            got.append(e)

    t = threading.Thread(target=waiting)
    t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    os.kill(first, 9)
    t.join(20)
    assert len(got) == 1 and isinstance(got[0], TransportError) and "went away" in str(got[0]), got
    assert time.monotonic() - t0 < 10  # not the command's bound: the server's end is seen at once
    assert link.run(["true"], timeout=10)[0] == 0 and link.hello["pid"] != first


def test_a_launcher_that_says_the_job_is_over_is_a_session_end_not_an_unreachable_node():
    # what srun prints when the allocation it was asked to join has ended
    over = AgentLink("node1", ["sh", "-c", 'echo "srun: error: Slurm job 42 has expired" >&2; exit 1', "sh"],
                     start_bound=10)
    with pytest.raises(SessionEnded, match="has expired"):
        over.call("hello", 10)
    other = AgentLink("node1", ["sh", "-c", 'echo "srun: error: Unable to resolve node1" >&2; exit 1', "sh"],
                      start_bound=10)
    with pytest.raises(TransportError) as e:
        other.call("hello", 10)
    assert not isinstance(e.value, SessionEnded) and "Unable to resolve" in str(e.value)
