"""The GPU proof's lines on two "nodes" reached over SSH (bench/proof_sshd.py sets them up): `qwen-tui check` with
its rehearsal, the NCCL transport it names, and qwen-tui's launcher (`qwen-tui replay`) with two torchrun agents."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proof_common import BENCH, Context, LineFailed, Result, free_port, tail


def nodes(ctx: Context):
    """Two sshd "nodes" for this line, each with half of the line's GPUs (bench/proof_sshd.py); None (and the
    reason in ctx.shared["nodes_why"]) where no sshd can be had. The caller takes them down."""
    sys.path.insert(0, str(BENCH))
    import proof_sshd

    sshd, how = proof_sshd.find_sshd(ctx.carry, ctx.scratch)
    if sshd is None:
        ctx.shared["nodes_why"] = how
        return None
    half = max(1, len(ctx.gpu_ids) // 2)
    keep = ("PYTHONPATH", "QWEN_TUI_CACHE", "TORCH_EXTENSIONS_DIR", "HF_HUB_OFFLINE", "NCCL_NVLS_ENABLE",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "PATH")
    base = {k: ctx.env[k] for k in keep if ctx.env.get(k)}
    node_env = []
    for i in range(2):
        e = dict(base)
        if not ctx.cpu:
            e["CUDA_VISIBLE_DEVICES"] = ctx.devices(ctx.gpu_ids[i * half:(i + 1) * half])
        node_env.append(e)
    n = proof_sshd.up(sshd, ctx.scratch / f"sshd-{'-'.join(map(str, ctx.gpu_ids)) or 'cpu'}-{time.monotonic_ns()}",
                      node_env)
    n.how = how
    n.gpus = [e.get("CUDA_VISIBLE_DEVICES", "") for e in node_env]
    return n


def two_node_preset(ctx: Context, n, name: str, **training: Any) -> Path:
    import yaml

    per = 1 if ctx.cpu else max(1, len(ctx.gpu_ids) // 2)
    work = [ctx.scratch / f"{name}-node-{i}" for i in range(2)]
    for w in work:
        w.mkdir(parents=True, exist_ok=True)
    preset = {
        "name": f"gpu-proof-{name}",
        "cluster": {"nodes": [{"host": h, "gpus": per, "workdir": str(w), "python": sys.executable}
                              for h, w in zip(n.hosts, work)],
                    "ssh_config": str(n.ssh_config), "known_hosts": str(n.known_hosts),
                    "identity_file": str(n.identity), "connect_timeout": 10},
        # both "nodes" are this machine: the master is reached on the loopback, as NCCL's and gloo's sockets are
        "network": {"master_addr": "127.0.0.1", "master_port": free_port(), "interface": "lo", "rdzv_timeout": 60},
        "training": {"model": "builtin:tiny", "data": "builtin:demo-chat", "method": "lora", "zero_stage": None,
                     "device": "cpu" if ctx.cpu else "cuda", "precision": "fp32" if ctx.cpu else "bf16",
                     "max_steps": 6, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1,
                     "model_max_length": 128, "gradient_checkpointing": False, "lora_r": 8, "save_strategy": "no",
                     "output_dir": str(ctx.scratch / f"{name}-output"), **training},
    }
    if not ctx.cpu:
        # NCCL between two agents of one host would use P2P or shared memory; with both off it takes the network
        # path it takes between machines, so the rehearsal's transport verdict reads a real NET line.
        preset["network"]["env"] = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"} if name == "check" else {}
    p = ctx.scratch / f"{name}.yaml"
    p.write_text(yaml.safe_dump(preset, sort_keys=False))
    return p


def with_nodes(line: str, body: Callable[[Context, Any], Result]) -> Callable[[Context], Result]:
    """The line's body on two sshd nodes of its own, taken down however it ends; skipped where no sshd is."""
    def run(ctx: Context) -> Result:
        n = nodes(ctx)
        if n is None:
            return Result(line, "", "skipped", ctx.shared["nodes_why"])
        try:
            return body(ctx, n)
        finally:
            n.down()
    return run


def _check(ctx: Context, n) -> Result:
    preset = two_node_preset(ctx, n, "check")
    res = ctx.run([sys.executable, "-m", "qwen_tui", "check", str(preset), "--json", "--accept-new-host-keys",
                   "--bandwidth-seconds", "1"], timeout=240, what="qwen-tui check", stdout_only=True)
    try:
        rep = json.loads(res.stdout)
    except ValueError:
        raise LineFailed(f"qwen-tui check printed no report (exit {res.returncode}): {tail(res.stdout)}") from None
    ctx.shared["check"] = rep
    errors = [f"{f.get('code')}: {f.get('message')}" for f in rep["findings"] if f.get("level") == "error"]
    rehearsal = [f for f in rep["findings"] if f.get("code") == "REHEARSAL"]
    if res.returncode != 0 or not rehearsal:
        return Result("check", "", "fail", "; ".join(errors)[:600] or f"exit {res.returncode}, no rehearsal verdict",
                      measured={"ok": rep.get("ok")})
    return Result("check", "", "pass", f"2 nodes over SSH ({n.how} sshd), every check ok; "
                  f"rehearsal: {rehearsal[0]['message']}",
                  measured={"matrix": rep["matrix"], "rehearsal": rehearsal[0]["message"],
                            "seconds": rep.get("seconds")})


def nccl_transport(ctx: Context) -> Result:
    rep = ctx.shared.get("check")
    if rep is None:
        return Result("nccl-transport", "", "skipped", "the check line gave no report to read")
    nets = {f.get("node"): f["message"] for f in rep["findings"] if f.get("code") in ("NCCL_NETWORK",
                                                                                      "NCCL_SOCKET_FALLBACK")}
    named = {k: v for k, v in nets.items() if "NET/" in v}
    ok = len(named) == 2
    return Result("nccl-transport", "", "pass" if ok else "fail",
                  "; ".join(v for _, v in sorted(nets.items(), key=lambda kv: str(kv[0])))
                  or "the check said nothing of NCCL's network", measured={"findings": nets})


def _gpu_of_pids() -> dict[int, str]:
    """pid -> the UUID of the GPU it computes on (nvidia-smi's compute apps), {} where nvidia-smi cannot say."""
    try:
        q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for ln in q.stdout.splitlines():
        parts = [x.strip() for x in ln.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            out[int(parts[0])] = parts[1]
    return out


def _launcher(ctx: Context, n) -> Result:
    """`qwen-tui replay` of a preset with two nodes reached over SSH: two torchrun agents, each with its GPUs;
    the run must end COMPLETED with every rank, and (on GPUs) the two nodes' ranks on different GPUs."""
    preset = two_node_preset(ctx, n, "launch")
    runs = ctx.scratch / "launch-runs"
    argv = [sys.executable, "-m", "qwen_tui", "replay", str(preset), "--skip-checks", "--accept-new-host-keys",
            "--runs-dir", str(runs), "--max-seconds", "240"]
    seen: dict[int, str] = {}
    with open(ctx.log, "a") as log:
        log.write(f"===== launcher: {' '.join(argv)}\n")
        log.flush()
        p = subprocess.Popen(argv, cwd=ctx.scratch, env=ctx.line_env(COLUMNS="160"), stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        limit = time.monotonic() + max(5.0, min(300.0, ctx.left()))
        while p.poll() is None:
            if time.monotonic() > limit:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
                raise LineFailed("qwen-tui replay did not finish in time")
            if not ctx.cpu:
                seen.update(_gpu_of_pids())
            time.sleep(1.0)
    metrics = sorted((ctx.scratch / "launch-node-0").glob(".qwen-tui/runs/*/metrics.jsonl"))
    recs = [json.loads(x) for x in metrics[-1].read_text().splitlines()] if metrics else []
    start = next((r for r in recs if r.get("event") == "start"), {})
    end = next((r for r in recs if r.get("event") == "end"), {})
    beats = {}
    for i in range(2):
        for f in (ctx.scratch / f"launch-node-{i}").glob(".qwen-tui/runs/*/heartbeat/rank-*.json"):
            b = json.loads(f.read_text())
            beats[b["rank"]] = b
    world = 2 * (1 if ctx.cpu else max(1, len(ctx.gpu_ids) // 2))
    problems = []
    if p.returncode != 0:
        problems.append(f"replay exited {p.returncode}")
    if start.get("world_size") != world:
        problems.append(f"world size {start.get('world_size')}, not {world}")
    if sorted(beats) != list(range(world)) or {b["node_rank"] for b in beats.values()} != {0, 1}:
        problems.append(f"heartbeats from ranks {sorted(beats)} of nodes {sorted({b['node_rank'] for b in beats.values()})}")
    gpus_by_node: dict[int, set] = {}
    if not ctx.cpu:
        for b in beats.values():
            if b["pid"] in seen:
                gpus_by_node.setdefault(b["node_rank"], set()).add(seen[b["pid"]])
        if len(gpus_by_node) == 2 and gpus_by_node[0] & gpus_by_node[1]:
            problems.append(f"the nodes' ranks shared a GPU: {gpus_by_node}")
    measured = {"world_size": start.get("world_size"), "end": end, "node_gpus": n.gpus,
                "gpu_uuids_by_node": {k: sorted(v) for k, v in gpus_by_node.items()}}
    if problems:
        return Result("launcher", "", "fail", "; ".join(problems) + f" (log: {ctx.log.name})", measured=measured)
    where = "" if ctx.cpu else (f", node GPUs {' and '.join(n.gpus)}" +
                                (" (seen on different GPUs)" if len(gpus_by_node) == 2 else ""))
    return Result("launcher", "", "pass", f"replay over SSH to 2 nodes, {world} ranks, {len(beats)} heartbeats, "
                  f"ended {end.get('status', end.get('state', 'ok'))}{where}", measured=measured)
