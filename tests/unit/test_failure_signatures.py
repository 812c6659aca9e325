"""Log signatures -> cause and fix (qwen_tui.cluster.failures), on lines real runs print."""

import pytest

from qwen_tui.cluster.failures import diagnose, explain

CASES = [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "CUDA_OOM"),
    ("OSError: [Errno 28] No space left on device: 'output/checkpoint-500'", "DISK_FULL"),
    ("ModuleNotFoundError: No module named 'peft'", "MODULE_MISSING"),
    ("RuntimeError: [enforce fail at gloo/transport/tcp/device.cc:84] ifa != nullptr. "
     "Unable to find address for: eth9", "NO_SUCH_INTERFACE"),
    ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "RDZV_TIMEOUT"),
    ("torch.distributed.DistStoreError: Timed out after 31 seconds waiting for clients. 2/3 clients joined.",
     "RDZV_TIMEOUT"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
     "[10.1.2.12]:34023", "CONN_RESET"),
    ("[E ProcessGroupNCCL.cpp:475] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)", "NCCL_TIMEOUT"),
    ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
     "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use", "ADDR_IN_USE"),
    ("socket.cpp:621] [c10d] The client socket has failed to connect to [node0]:29500 (errno: 111 - "
     "Connection refused).", "CONN_REFUSED"),
]


@pytest.mark.parametrize("line,code", CASES)
def test_signature(line, code):
    d = diagnose("some noise\n" + line + "\nmore noise")
    assert d is not None and d.code == code and d.fix


def test_oom_wins_over_its_consequences():
    log = "Connection reset by peer\nCUDA out of memory. Tried to allocate\nWatchdog caught collective operation timeout"
    assert diagnose(log).code == "CUDA_OOM"


def test_module_name_and_explain_show_cause_fix_and_tail():
    text = "\n".join(f"line {i}" for i in range(30)) + "\nModuleNotFoundError: No module named 'training'"
    d = diagnose(text, python="/opt/py/bin/python")
    assert "'training'" in d.cause and "/opt/py/bin/python -m pip" in d.fix
    e = explain("node2", text)
    assert e.startswith("node2: the Python module 'training'") and "line 29" in e and "line 3\n" not in e
    assert diagnose("all good\nstep 5 loss 1.0") is None
