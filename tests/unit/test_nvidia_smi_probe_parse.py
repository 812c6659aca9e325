"""The probe's nvidia-smi parsing, on real H200 output (tests/fixtures/nvidia-smi)."""

from pathlib import Path

import pytest

from qwen_tui.nodes.checks.probe import (
    facts_from_json,
    local_path,
    parse_cuda_from_version,
    parse_driver,
    parse_gpu_csv,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"  # real output: tests/fixtures/nvidia-smi/README.md
FIELDS = ("index,name,uuid,pci.bus_id,driver_version,memory.total,memory.used,memory.free,utilization.gpu,"
          "utilization.memory,temperature.gpu,power.draw,power.limit").split(",")


@pytest.mark.parametrize("name", ["query_idle.csv", "query_busy.csv", "query_idle_header.csv",
                                  "query_busy_header.csv"])
def test_query_csv_with_and_without_header(name):
    text = (FIX / name).read_text()
    gpus = parse_gpu_csv(text, FIELDS)
    assert len(gpus) == 1
    g = gpus[0]
    assert (g.index, g.name, g.memory_total_mib) == (0, "NVIDIA H200", 143771)
    assert g.uuid == "GPU-c36dfc59-29de-306b-12b0-a3349d63455c"
    assert parse_driver(text, FIELDS) == "580.159.04"


def test_stream_lines_are_one_gpu_each_and_version_gives_cuda():
    assert len(parse_gpu_csv((FIX / "query_stream.csv").read_text(), FIELDS)) == 6
    assert parse_cuda_from_version((FIX / "version.txt").read_text()) == "13.0"
    assert parse_gpu_csv("", FIELDS) == []


def test_probe_json_to_facts_cpu_only_and_gpu_node():
    base = {"hostname": "n", "tools": {"nvidia-smi": None, "iperf3": "/usr/bin/iperf3"}, "versions": {}}
    cpu = facts_from_json(base)
    assert cpu.gpus == [] and cpu.missing_tools == ["nvidia-smi"]
    text = (FIX / "query_idle_header.csv").read_text()
    gpu = facts_from_json({**base, "tools": {"nvidia-smi": "/usr/bin/nvidia-smi"},
                           "nvidia_smi": {"rc": 0, "out": text, "err": ""},
                           "nvidia_smi_version": {"rc": 0, "out": (FIX / "version.txt").read_text()}})
    assert gpu.gpu_count == 1 and gpu.driver_version == "580.159.04" and gpu.versions["cuda_driver"] == "13.0"
    broken = facts_from_json({**base, "nvidia_smi": {"rc": 9, "out": "", "err": "NVML: Driver/library mismatch"}})
    assert broken.gpus is None and "mismatch" in broken.error


def test_local_path_skips_builtins_and_hub_ids():
    assert local_path("builtin:tiny") is None and local_path("Qwen/Qwen2.5-7B-Instruct") is None
    assert local_path("/data/x.jsonl") == "/data/x.jsonl" and local_path("~/d.json") == "~/d.json"
