"""Hardware faults in a node's log, each with what it means and what to do: the GPU driver's Xid reports, memory errors
ECC could not correct, a GPU fallen off the bus, NVLink errors, and NCCL's InfiniBand completions that failed
(status=12: the peer's NIC stopped answering; status=5: flushed after an earlier failure). Pure: cluster/failures.py
puts them before every software signature, since an NCCL timeout or a lost peer follows them.

The lines they match are real ones from public reports, kept with their source in tests/fixtures/hardware_faults/.
"""

from __future__ import annotations

import re

# The Xid codes a training run meets most (NVIDIA's Xid catalog), in a few words each, and whether the GPU must be
# reset or its node rebooted before it trains again.
XID_MEANING: dict[int, tuple[str, bool]] = {
    13: ("a graphics engine exception (often the application's own bad memory access)", False),
    31: ("a GPU memory page fault (an illegal address: the application, or a driver problem)", False),
    43: ("the GPU stopped processing (the user application was ended after a fault)", False),
    45: ("preemptive cleanup after an earlier error (look for the Xid before it)", False),
    48: ("a double-bit ECC error in GPU memory", True),
    61: ("an internal microcontroller breakpoint/warning", True),
    62: ("an internal microcontroller halt", True),
    63: ("ECC page retirement or row remapping recorded", False),
    64: ("ECC page retirement or row remapping failed", True),
    74: ("an NVLink error", True),
    79: ("the GPU has fallen off the bus", True),
    92: ("a high single-bit ECC error rate", False),
    94: ("a contained ECC error (the affected application ended; the GPU goes on)", False),
    95: ("an uncontained ECC error (every application on the GPU is affected)", True),
    109: ("a context switch timeout", False),
    119: ("a GSP firmware RPC timeout", True),
    120: ("a GSP firmware error", True),
    **{code: ("an NVLink error (link, switch or fabric)", True) for code in range(144, 151)},
}

IB_STATUS = {
    12: ("the InfiniBand/RoCE transport retry counter ran out talking to peer {peer}: its NIC stopped answering (a "
         "link, cable or switch port down, or the peer's host gone)",
         "check the link between this node and {peer} (ibstat, ibv_devinfo, the switch port's counters) and run "
         "nccl-tests between the two; NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT (network.env) only lengthen the wait"),
    5: ("an InfiniBand/RoCE work request to peer {peer} was flushed: its queue pair had already failed",
        "a consequence of an earlier failure: look for the node with status=12, or the one that failed first"),
}

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")
_IB = re.compile(r"NET/IB ?: ?Got completion from peer (\S+) with (?:status=|error )(\d+)")

# (code, pattern, cause, fix); XID and IB are built from the line (xid_fault, ib_fault)
SIGNATURES: list[tuple[str, str, str, str]] = [
    ("GPU_LOST", r"fallen off the bus|GPU is lost|Unable to determine the device handle for GPU",
     "a GPU fell off the bus (Xid 79): it no longer answers the driver",
     "take the node out (training.exclude_failed relaunches without it) and reboot it; if it recurs, check its "
     "power, cooling and seating (nvidia-smi -q, the BMC's log)"),
    ("GPU_ECC", r"uncorrectable ECC error|ECC_UNCORRECTABLE|ECC error encountered",
     "a GPU memory error that ECC could not correct",
     "take the node out (training.exclude_failed), then reset the GPU (nvidia-smi -r) or reboot so the page is "
     "retired or the row remapped; if it recurs the GPU needs replacing (nvidia-smi -q -d ECC,PAGE_RETIREMENT,"
     "ROW_REMAPPER)"),
    ("NVLINK_ERROR", r"uncorrectable NVLink error|NVLink error detected|NVLINK_(?:ERROR|SAW|RLW|NETIR)",
     "an NVLink error between the node's GPUs",
     "reset the GPUs or reboot the node; check nvidia-smi nvlink -e and the fabric manager's log (NVSwitch "
     "systems); the run relaunches without the node with training.exclude_failed"),
]

_COMPILED = [(c, re.compile(p, re.IGNORECASE), cause, fix) for c, p, cause, fix in SIGNATURES]


def xid_fault(line: str) -> tuple[str, str, str] | None:
    """(code, cause, fix) for an `NVRM: Xid (PCI:...): N, ...` line, or None."""
    m = _XID.search(line)
    if not m:
        return None
    bus, code = m.group(1), int(m.group(2))
    what, reset = XID_MEANING.get(code, ("a GPU error (see NVIDIA's Xid catalog)", True))
    cause = f"the GPU at PCI {bus} reported Xid {code}: {what}"
    if reset:
        fix = ("take the node out (training.exclude_failed relaunches without it); reset that GPU (nvidia-smi -r) "
               "or reboot the node before it trains again, and see NVIDIA's Xid catalog for Xid "
               f"{code}; if it recurs, the GPU or its links need service")
    else:
        fix = (f"Xid {code} often follows a fault of the application itself: read the rank's own error first; if it "
               "recurs on the same GPU alone, reset it (nvidia-smi -r)")
    return ("GPU_XID", cause, fix)


def ib_fault(line: str) -> tuple[str, str, str] | None:
    """(code, cause, fix) for NCCL's `NET/IB : Got completion from peer P with status=N` line, or None."""
    m = _IB.search(line)
    if not m:
        return None
    peer, status = m.group(1), int(m.group(2))
    cause, fix = IB_STATUS.get(status, (f"an InfiniBand/RoCE completion to peer {{peer}} failed with status {status}",
                                        "check the InfiniBand/RoCE links of this node and {peer} (ibstat, the switch)"))
    return (f"IB_STATUS_{status}", cause.format(peer=peer), fix.format(peer=peer))


def hardware_fault(line: str) -> tuple[str, str, str] | None:
    """(code, cause, fix) for a line that reports a hardware fault, or None."""
    for c, rx, cause, fix in _COMPILED:
        if rx.search(line):
            return (c, cause, fix)
    return xid_fault(line) or ib_fault(line)


# An IB flush follows an earlier failure: a consequence, as a peer's lost connection is.
CONSEQUENTIAL_HW = frozenset({"IB_STATUS_5"})


def hardware_signatures() -> list[tuple[str, str, str, str]]:
    """(code, pattern, cause, fix) of every hardware fault, for the manual: the fixed ones as they are, an Xid's and an
    IB completion's with the words their line fills in."""
    out = list(SIGNATURES)
    out.append(("GPU_XID", _XID.pattern, "the GPU at PCI <bus> reported Xid <N>: what N means (NVIDIA's Xid catalog: "
                + "; ".join(f"{k} {v[0]}" for k, v in sorted(XID_MEANING.items()) if k < 144) + "; 144-150 NVLink)",
                "for an Xid that needs it (48, 64, 74, 79, 95, 119, 120, 144-150 and unknown ones): take the node out "
                "and reset the GPU or reboot; for the others read the rank's own error first"))
    for status, (cause, fix) in sorted(IB_STATUS.items(), reverse=True):
        out.append((f"IB_STATUS_{status}", _IB.pattern, cause.format(peer="<peer>"), fix.format(peer="<peer>")))
    return out
