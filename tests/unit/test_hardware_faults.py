"""Hardware faults named on real log lines (tests/fixtures/hardware_faults/, each with its source): the fault, the
GPU or peer it names, and its fix; a hardware fault wins over the NCCL errors and lost peers that follow it, and an
InfiniBand flush (status=5), itself a consequence, does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwen_tui.cluster.failures import CONSEQUENTIAL, diagnose

FIX = Path(__file__).parents[1] / "fixtures" / "hardware_faults"

# file -> (code, words the cause must hold, words the fix must hold)
EXPECTED = {
    "xid_79_fallen_off_bus.log": ("GPU_LOST", ["fell off the bus"], ["reboot", "exclude_failed"]),
    "xid_94_contained_ecc.log": ("GPU_XID", ["PCI 0000:9b:00", "Xid 94", "contained ECC error"],
                                 ["the rank's own error first", "nvidia-smi -r"]),
    "xid_145_nvlink.log": ("GPU_XID", ["PCI 0018:01:00", "Xid 145", "NVLink"], ["reset that GPU", "Xid catalog"]),
    "cuda_ecc_uncorrectable.log": ("GPU_ECC", ["ECC could not correct"], ["nvidia-smi -r", "ROW_REMAPPER"]),
    "cuda_nvlink_uncorrectable.log": ("NVLINK_ERROR", ["NVLink"], ["nvlink -e", "exclude_failed"]),
    "nccl_ib_status_12.log": ("IB_STATUS_12", ["retry counter", "10.216.210.236<54862>"],
                              ["ibstat", "nccl-tests", "NCCL_IB_TIMEOUT"]),
    "nccl_ib_status_5.log": ("IB_STATUS_12", ["172.36.143.59<44206>"], ["ibstat"]),
    "gpu_lost_nvidia_smi.log": ("GPU_LOST", ["fell off the bus"], ["reboot"]),
}


def test_every_fixture_is_checked_and_names_its_source():
    files = sorted(p.name for p in FIX.glob("*.log"))
    assert files == sorted(EXPECTED)
    for name in files:
        first = (FIX / name).read_text().splitlines()[0]
        assert first.startswith("# source: https://github.com/"), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_real_fault_is_named_with_its_fix(name):
    code, cause, fix = EXPECTED[name]
    d = diagnose((FIX / name).read_text())
    assert d is not None and d.code == code, (name, d)
    for w in cause:
        assert w in d.cause, (name, d.cause)
    for w in fix:
        assert w in d.fix, (name, d.fix)


def test_a_hardware_fault_wins_over_what_follows_it_and_a_flush_alone_is_a_consequence():
    ecc = (FIX / "cuda_ecc_uncorrectable.log").read_text()
    after = "[E ProcessGroupNCCL.cpp:475] Watchdog caught collective operation timeout\nConnection reset by peer\n"
    assert diagnose(after + ecc).code == "GPU_ECC"
    flush = [ln for ln in (FIX / "nccl_ib_status_5.log").read_text().splitlines() if "status=5" in ln][0]
    d = diagnose("noise\n" + flush)
    assert d.code == "IB_STATUS_5" and d.code in CONSEQUENTIAL and "earlier failure" in d.fix
    assert diagnose(flush + "\ntorch.OutOfMemoryError: CUDA out of memory.").code == "CUDA_OOM"
    assert diagnose("NCCL INFO Channel 00/0 : 0[6] -> 1[6] via P2P/NVLink") is None  # NVLink in use is no error


def test_the_kernel_log_since_the_run_began_names_the_xid_and_an_older_one_is_not_this_runs():
    """Xid reports are in the node's kernel log, not the run's: what the launcher reads there on a CUDA run's failure
    (run/watch/evidence.py), dmesg's and journalctl's ISO stamps alike; a fault from before the run began is left
    out."""
    import datetime

    from qwen_tui.run.watch.evidence import kernel_faults

    xid = [ln for ln in (FIX / "xid_79_fallen_off_bus.log").read_text().splitlines() if "Xid" in ln][0]
    began = datetime.datetime(2026, 12, 5, 1, 0, tzinfo=datetime.timezone.utc).timestamp()
    log = "\n".join([
        "2026-12-04T09:00:00,000001+00:00 " + xid.replace("79", "48").replace("fallen off the bus", "DBE"),  # before
        "2026-12-05T01:20:00,000001+00:00 mlx5_core 0000:ab:00.0: Port: 1 Link ACTIVE",
        "2026-12-05T01:30:18,928022+00:00 " + xid,  # dmesg --time-format iso
        "2026-12-05T01:31:00+0000 node3 kernel: " + xid.replace("0000:44:00", "0000:45:00"),  # journalctl short-iso
    ])
    found = kernel_faults(log, since=began)
    assert [f[0] for f in found] == ["GPU_LOST", "GPU_LOST"] and "0000:45:00" in found[0][3]
    assert len(kernel_faults(log)) == 3  # without a start, every fault the log holds
