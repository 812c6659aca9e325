"""bench/gpu_gaps.py on a small hand-written Chrome trace whose idle gaps are known."""

from __future__ import annotations

import gzip
import importlib.util
import json

import pytest

from support.paths import ROOT


def _gaps():
    spec = importlib.util.spec_from_file_location("gpu_gaps", ROOT / "bench" / "gpu_gaps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _x(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1 if cat not in ("kernel",) else 0,
            "tid": tid, "args": args}


def _trace():
    """One labelled forward: a matmul kernel, then the host blocks in a synchronisation (240 us of idle device),
    then an add kernel launched by aten::add, then 540 us of host work after the last kernel."""
    return [
        _x("step: forward", "user_annotation", 0, 1000),
        _x("aten::mm", "cpu_op", 10, 10),
        _x("cudaLaunchKernel", "cuda_runtime", 12, 2, correlation=1),
        _x("gemm_kernel", "kernel", 20, 100, tid=7, correlation=1),
        _x("aten::item", "cpu_op", 130, 200),
        _x("cudaStreamSynchronize", "cuda_runtime", 131, 169),
        _x("aten::add", "cpu_op", 340, 15),
        _x("cudaLaunchKernel", "cuda_runtime", 350, 2, correlation=2),
        _x("add_kernel", "kernel", 360, 100, tid=7, correlation=2),
        _x("overlapping_kernel", "kernel", 380, 20, tid=8, correlation=99),  # inside the add: no gap of its own
    ]


def test_gaps_are_measured_and_charged_to_the_launching_phase_and_operator():
    g = _gaps()
    res = g.analyse(_trace(), min_gap_us=20)
    assert res["wall_us"] == 1000
    assert res["device_busy_us"] == 200  # 20-120 and 360-460; the overlapping kernel adds nothing
    assert res["idle_us"] == 800
    gaps = {(r["before"], r["after"]): r for r in res["largest"]}
    mid = gaps[("gemm_kernel", "add_kernel")]
    assert mid["gap_us"] == 240 and mid["phase"] == "step: forward" and mid["op"].endswith("aten::add")
    assert mid["host"] == {"cudaStreamSynchronize": 169, "cudaLaunchKernel": 2}
    assert gaps[("(step start)", "gemm_kernel")]["gap_us"] == 20
    tail = gaps[("add_kernel", "(step end)")]
    assert tail["gap_us"] == 540 and tail["phase"] == "(after the last kernel)"
    assert res["largest"][0] is tail  # largest first
    text = g.report(res, top=5)
    assert "device busy 0.2 ms (20.0%)" in text and "step: forward / aten::add" in text


def test_short_gaps_are_left_out_of_the_list_but_not_of_the_idle_time():
    res = _gaps().analyse(_trace(), min_gap_us=100)
    assert res["idle_us"] == 800
    assert sorted(r["gap_us"] for r in res["largest"]) == [240, 540]


def test_reads_gzip_traces_and_refuses_a_trace_without_kernels(tmp_path):
    g = _gaps()
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump({"traceEvents": _trace()}, f)
    assert len(g.load(str(p))) == len(_trace())
    with pytest.raises(SystemExit, match="no device kernels"):
        g.analyse([e for e in _trace() if e["cat"] != "kernel"])


def test_kernel_mix_sums_device_time_by_kind_and_launching_phase():
    g = _gaps()
    events = _trace() + [
        _x("step: backward", "user_annotation", 1000, 500),
        _x("cudaLaunchKernel", "cuda_runtime", 1010, 2, correlation=3),
        _x("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "kernel", 1020, 300, tid=7, correlation=3),
        _x("cudaLaunchKernel", "cuda_runtime", 1030, 2, correlation=4),
        _x("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>", "kernel", 1330, 50, tid=7,
           correlation=4),
        _x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 1400, 5, tid=7, correlation=5),
    ]
    mix = g.kernel_mix(events)
    kinds = {k["kind"]: k for k in mix["kinds"]}
    assert mix["kernel_us"] == 100 + 100 + 20 + 300 + 50 + 5
    # gemm_kernel (forward) and nvjet (backward) are matmuls; the rest by name or category
    assert kinds["matmul"]["us"] == 400 and kinds["matmul"]["count"] == 2
    assert kinds["matmul"]["by_phase"] == {"step: backward": 300, "step: forward": 100}
    assert kinds["attention"]["us"] == 50 and kinds["copy / fill"]["us"] == 5
    assert kinds["other"]["us"] == 120 and kinds["other"]["by_phase"] == {"step: forward": 100, "(unlabelled)": 20}
    assert mix["kinds"][0]["kind"] == "matmul" and abs(sum(k["share"] for k in mix["kinds"]) - 1) < 1e-9
    assert kinds["matmul"]["top"][0]["name"].startswith("nvjet")
    text = g.mix_report(mix)
    assert "matmul: backward 0.3, forward 0.1" in text
    with pytest.raises(SystemExit, match="no device kernels"):
        g.kernel_mix([e for e in events if e["cat"] not in ("kernel", "gpu_memcpy")])
