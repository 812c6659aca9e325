"""Known failure signatures in a node's log -> cause and fix. Pure: text in,
diagnosis out, so the launcher, the rehearsal and the TUI explain a dead run
the same way, next to the node's last log lines."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .hardware_faults import CONSEQUENTIAL_HW, hardware_fault, hardware_signatures


@dataclass(frozen=True)
class Diagnosis:
    code: str
    cause: str
    fix: str
    line: str  # the log line that matched


# Most specific first: an OOM also makes NCCL and torchrun complain afterwards.
_SIGNATURES: list[tuple[str, str, str, str]] = [
    ("CUDA_OOM", r"CUDA out of memory|torch\.OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED",
     "a GPU ran out of memory",
     "lower per_device_train_batch_size or model_max_length, turn on gradient_checkpointing, "
     "or use ZeRO-3 / offload"),
    ("DISK_FULL", r"No space left on device|ENOSPC|Disk quota exceeded",
     "the disk is full on this node",
     "free space in the output and cache directories, or point training.output_dir elsewhere"),
    ("MODULE_MISSING", r"(?:ModuleNotFoundError|ImportError): No module named '?([\w.]+)'?",
     "a Python module is missing on this node",
     "install it into the node's Python ({py} -m pip install ...) or sync the project code: "
     "qwen-tui check --sync"),
    ("NO_SUCH_INTERFACE", r"Unable to find address for|Unable to find interface|"
     r"SOCKET_IFNAME.*(?:not found|No such device)|no socket interface found|Bootstrap : no socket interface",
     "the socket interface set for NCCL/gloo does not exist on this node",
     "fix network.interface (or leave it empty so the probe picks the interface that routes to the master)"),
    ("RDZV_TIMEOUT", r"RendezvousTimeoutError|Timed out after \d+ seconds waiting for clients|"
     r"rendezvous.*timed? ?out|The client socket has timed out after|"
     r"DistStoreError|Socket Timeout",
     "the rendezvous timed out: not every node joined",
     "check that every node started and can reach MASTER_ADDR:MASTER_PORT (qwen-tui check)"),
    ("CONN_REFUSED", r"Connection refused|ECONNREFUSED|connect\(\) failed.*refused",
     "a connection between nodes was refused (nothing listening, or a REJECT rule)",
     "check the master address and port, and the firewall between the nodes"),
    ("CONN_RESET", r"Connection reset by peer|ECONNRESET|Connection closed by peer|Broken pipe|"
     r"recvBytes|Read error \[.*\]: Connection reset",
     "a peer rank went away mid-collective (it crashed or was killed)",
     "look at the other nodes' logs: the first node that failed is the cause"),
    ("NCCL_TIMEOUT", r"Watchdog caught collective operation timeout|NCCL.*[Tt]imeout|"
     r"ProcessGroupNCCL.*timed out|Gloo.*[Tt]imed out|Timed out waiting \d+ms for",
     "a collective timed out: one rank stopped answering, or the network between nodes is blocked",
     "check the ephemeral port range between the nodes and the interface setting "
     "(NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME); qwen-tui check runs a rehearsal"),
    ("NCCL_ERROR", r"NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError",
     "NCCL failed",
     "run with NCCL_DEBUG=INFO (network.env) and look for the first WARN line"),
    ("ADDR_IN_USE", r"Address already in use|EADDRINUSE",
     "the master port is already taken on the master",
     "pick another network.master_port, or stop the earlier run"),
    ("KILLED", r"Signals\.SIGKILL|signal 9|Killed$",
     "a rank was killed (out of host memory, or by hand)",
     "check `dmesg` for the OOM killer on that node; lower the batch size or offload"),
]
# Causes that are consequences of another node's failure rather than a cause of their own.
CONSEQUENTIAL = frozenset({"CONN_RESET", "RDZV_TIMEOUT", "NCCL_TIMEOUT", "CONN_REFUSED", "KILLED"}) | CONSEQUENTIAL_HW



def signatures() -> list[tuple[str, str, str, str]]:
    """Every known signature, most specific first: (code, pattern, cause, fix), the hardware faults before the
    software ones (cluster/hardware_faults.py; an Xid's and an IB completion's cause and fix come from the line).
    The manual's troubleshooting page is generated from them (docs/gen_reference.py)."""
    return [*hardware_signatures(), *_SIGNATURES]


_COMPILED = [(c, re.compile(p, re.IGNORECASE if c != "KILLED" else 0), cause, fix)
             for c, p, cause, fix in _SIGNATURES]


def diagnose(log_text: str, python: str = "python3") -> Diagnosis | None:
    """The first signature (in priority order) found anywhere in the log text: a hardware fault first
    (cluster/hardware_faults.py: what an NCCL error or a lost peer follows), then the software signatures; an IB
    flush, a consequence, only where nothing else matched."""
    lines = log_text.splitlines()
    later: Diagnosis | None = None
    for ln in lines:
        hw = hardware_fault(ln)
        if hw is not None:
            d = Diagnosis(hw[0], hw[1], hw[2], ln.strip()[:300])
            if hw[0] not in CONSEQUENTIAL_HW:
                return d
            later = later or d
    for code, rx, cause, fix in _COMPILED:
        for ln in lines:
            m = rx.search(ln)
            if m:
                if code == "MODULE_MISSING" and m.groups():
                    cause = f"the Python module '{m.group(1)}' is missing on this node"
                return Diagnosis(code, cause, fix.replace("{py}", python), ln.strip()[:300])
    return later


_RULE = re.compile(r"^\s*={20,}\s*$")


def without_agent_report(lines: list[str]) -> list[str]:
    """A node's log lines without torchrun's own account of a failed worker: its ChildFailedError traceback
    and the "Root Cause ... error_file: <N/A>" block after it say only that a rank exited, and pushed the
    worker's own error line (e.g. "error: chat.jsonl: data file not found") out of the tail a user sees."""
    out = list(lines)
    while True:
        at = next((i for i, ln in enumerate(out) if "ChildFailedError" in ln), None)
        if at is None:
            return out
        start = at
        for i in range(at, -1, -1):  # back to the traceback it ends
            if out[i].startswith("Traceback (most recent call last)"):
                start = i
                break
        rules = [i for i in range(at + 1, len(out)) if _RULE.match(out[i])]
        end = rules[1] if len(rules) > 1 else (rules[0] if rules else at)  # the report is framed by two rules
        del out[start:end + 1]


def worker_error(lines: list[str]) -> str | None:
    """The worker's own one-line error (bad input: it prints `error: ...` and exits 2), if the log holds one."""
    for ln in reversed(lines):
        if ln.startswith("error: "):
            return ln[len("error: "):].strip()[:300]
    return None


def explain(label: str, log_text: str, *, python: str = "python3", tail: int = 15) -> str:
    """A paragraph for the user: the node, cause and fix, then its last log lines."""
    d = diagnose(log_text, python)
    lines = [ln for ln in log_text.splitlines() if ln.strip()][-tail:]
    head = f"{label}: {d.cause}. Fix: {d.fix}" if d else f"{label}: no known failure signature in its log"
    return head + ("\n  last log lines:\n" + "\n".join("    " + ln for ln in lines) if lines else "")


def describe_exception(err: BaseException, *, depth: int = 5) -> str:
    """An unexpected exception for the user: its type, message and where it was raised,
    then each cause behind it (`raise ... from` or raised while handling another)."""
    import traceback

    out: list[str] = []
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen and len(seen) < depth:
        seen.add(id(e))
        where = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
        at = f"\n  at {where[0].filename}:{where[0].lineno} in {where[0].name}" if where else ""
        out.append(("caused by: " if out else "") + f"{type(e).__name__}: {e}{at}")
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return "\n".join(out)
