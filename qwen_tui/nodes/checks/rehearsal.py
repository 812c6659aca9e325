"""Rehearsal: a few-second torchrun job on every node with the real backend,
interface and port settings (taken from the LaunchPlan), doing the rendezvous
and an all-reduce. It catches what iperf3 cannot: a wrong NCCL/gloo interface,
a port range blocked for the collective. Bounded: the job's own timeouts plus a
deadline here, after which every node's group is stopped. `add_rehearsal` puts its
verdict into a node-check report (the rehearsal column of `qwen-tui check`).
It starts a job of the plan, so it lives with the launch (run/), above the checks.

With NCCL, the rehearsal runs with NCCL_DEBUG=INFO and reports, per node, the
network NCCL chose between nodes (NET/IB or NET/Socket), read from those lines.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
import uuid
from dataclasses import dataclass, field

from qwen_tui.cluster.facts import ClusterFacts
from qwen_tui.cluster.failures import CONSEQUENTIAL, Diagnosis, diagnose
from qwen_tui.cluster.ib import nccl_transport
from qwen_tui.nodes.checks.containers import remove as remove_container
from qwen_tui.nodes.checks.findings import ERROR, INFO, Finding
from qwen_tui.nodes.checks.ibcheck import nccl_network_findings
from qwen_tui.nodes.checks.runner import CheckReport
from qwen_tui.nodes.programs import program
from qwen_tui.nodes.results import on_nodes
from qwen_tui.nodes.transport.protocol import Transport, stop_group
from qwen_tui.plan.container import with_env
from qwen_tui.plan.estimate_comm import REHEARSAL_BUCKET_MB
from qwen_tui.plan.launch import LaunchPlan, NodeCommand
from qwen_tui.preset.schema import Preset

# Runs in every rank. Prints one line "QT_REHEARSAL {json}".
SNIPPET = program("rehearsal.py")


@dataclass
class RehearsalResult:
    ok: bool
    message: str
    wall_s: float
    meet_s: float | None = None
    busbw_gbps: float | None = None
    size_mb: float | None = None  # the all-reduce message busbw was measured at
    failed_node: int | None = None
    diagnosis: Diagnosis | None = None
    rcs: dict[int, int | None] = field(default_factory=dict)
    log_tails: dict[int, list[str]] = field(default_factory=dict)
    left_running: list[int] = field(default_factory=list)  # nodes where a process survived the stop (never expected)
    transports: dict[int, str | None] = field(default_factory=dict)  # node -> "IB" | "Socket" | ... (NCCL's word)


# One timed all-reduce may take this long; a slower link is measured at a smaller message (the job says so).
ALLREDUCE_BUDGET_S = 3.0

# What the rehearsal needs NCCL to say: its INIT and NET lines name the network it chose.
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def rehearsal_env(env: dict[str, str], backend: str) -> dict[str, str]:
    """The node's plan env for the rehearsal: with NCCL, its INFO lines on (over the preset's own choice) and
    in the job's log, where they are read (not in an NCCL_DEBUG_FILE)."""
    if backend != "nccl":
        return {**env, "QT_BACKEND": backend}
    return {**{k: v for k, v in env.items() if k != "NCCL_DEBUG_FILE"}, "QT_BACKEND": backend, **NCCL_DEBUG_ENV}


def _tail(text: str, n: int = 15) -> list[str]:
    """The last lines worth showing: NCCL's INFO chatter would bury the error."""
    return [x for x in text.splitlines() if x.strip() and " NCCL INFO " not in x][-n:]


def rehearsal_size_mb(backend: str) -> float:
    """The all-reduce message the rehearsal measures at: a bucket's size on GPUs (estimate_comm.REHEARSAL_BUCKET_MB),
    or $QWEN_TUI_REHEARSAL_MB; gloo (CPU processes) 32 MB by default, where no bucket size is modelled."""
    env = os.environ.get("QWEN_TUI_REHEARSAL_MB", "").strip()
    if env:
        try:
            v = float(env)
        except ValueError:
            raise ValueError(f"QWEN_TUI_REHEARSAL_MB={env!r}: not a number of MB") from None
        if v <= 0:
            raise ValueError(f"QWEN_TUI_REHEARSAL_MB={env!r}: must be positive")
        return v
    return float(REHEARSAL_BUCKET_MB) if backend == "nccl" else 32.0


def rehearsal_argv(argv: list[str], python: str, size_mb: float, timeout: int,
                   budget_s: float = ALLREDUCE_BUDGET_S) -> list[str]:
    """The plan's torchrun argv with the training module replaced by the rehearsal."""
    try:
        cut = argv.index("training.finetune") - 1
    except ValueError:
        raise ValueError("the plan's argv does not run training.finetune; cannot derive a rehearsal") from None
    return [*argv[:cut], "--no-python", python, "-c", SNIPPET, f"{size_mb:g}", str(timeout), f"{budget_s:g}"]


def rehearsal_job(c: NodeCommand, backend: str, python: str, size_mb: float, timeout: int,
                  budget_s: float = ALLREDUCE_BUDGET_S) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of node `c`'s rehearsal: inside its container where the plan has one (the image that trains is
    the one rehearsed), the rehearsal's own variables passed in too."""
    env = rehearsal_env(c.env, backend)
    argv = rehearsal_argv(c.argv, python, size_mb, timeout, budget_s)
    box = with_env(c.container, [k for k in env if k not in c.env]) if c.container else []
    return [*box, *argv], env


def rehearse(plan: LaunchPlan, transports: dict[int, Transport], *, pythons: dict[int, str],
             deadline_s: float = 60.0, size_mb: float | None = None, collective_timeout: int = 30,
             allreduce_budget_s: float = ALLREDUCE_BUDGET_S,
             facts: ClusterFacts | None = None, poll: float = 0.3) -> RehearsalResult:
    """The rehearsal on every node. size_mb: the all-reduce message (default rehearsal_size_mb(plan.backend)); on a
    link too slow to move it within ALLREDUCE_BUDGET_S the job measures at a smaller power of two and says so."""
    if size_mb is None:
        size_mb = rehearsal_size_mb(plan.backend)
    rid = f"rehearsal-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    cmds = {c.rank: c for c in plan.nodes}
    paths, dirs = {}, {}
    for r in cmds:
        # in the node's home, not its workdir (which may be a shared project checkout)
        d = posixpath.join("~", ".qwen-tui", "rehearsal", rid)
        d = transports[r].abspath(d)
        dirs[r] = d
        paths[r] = (posixpath.join(d, f"node-{r}.log"), posixpath.join(d, f"node-{r}.rc"))

    def start(r: int) -> int:
        c = cmds[r]
        argv, env = rehearsal_job(c, plan.backend, pythons[r], size_mb, collective_timeout, allreduce_budget_s)
        return transports[r].start_job(argv, env=env, cwd=c.workdir, log=paths[r][0], rcfile=paths[r][1])

    started = on_nodes(start, sorted(cmds), timeout=60)
    pids = started.succeeded
    rcs: dict[int, int | None] = {r: None for r in cmds}
    failed_start = started.failed
    msg = ""
    while not failed_start:
        reads = on_nodes(lambda r: transports[r].read_file(paths[r][1], timeout=10), sorted(cmds), timeout=15)
        for r, v in reads.items():
            if isinstance(v, BaseException):
                failed_start[r] = v  # the node stopped answering
            elif v.strip():
                rcs[r] = int(v.strip()) if v.strip().lstrip(b"-").isdigit() else -1
        if failed_start or any(v not in (None, 0) for v in rcs.values()) or all(v == 0 for v in rcs.values()):
            break
        if time.monotonic() - t0 > deadline_s:
            msg = f"not done within {deadline_s:g}s"
            break
        time.sleep(poll)

    # Stop whatever still runs, everywhere, before reading the logs.
    def stop(r: int) -> bool:
        gone = stop_group(transports[r], pids[r], grace=3)
        # and the node's container, which a killed runtime client may leave behind
        return (remove_container(transports[r], cmds[r].container) is None) and gone if cmds[r].container else gone

    stops = on_nodes(stop, sorted(pids), timeout=90)
    left = sorted(r for r, v in stops.items() if v is not True)
    tails = on_nodes(lambda r: transports[r].read_file(paths[r][0], offset=0, limit=4 << 20, timeout=10),
                     sorted(cmds), timeout=20)
    texts = {r: (v.decode(errors="replace") if isinstance(v, bytes) else "") for r, v in tails.items()}
    recs = {}
    for r, txt in texts.items():
        for ln in txt.splitlines():
            if ln.startswith("QT_REHEARSAL "):
                rec = json.loads(ln.split(" ", 1)[1])
                recs[(r, rec["rank"])] = rec
    wall = time.monotonic() - t0
    res = RehearsalResult(ok=False, message="", wall_s=wall, rcs=rcs, left_running=left,
                          log_tails={r: _tail(t) for r, t in texts.items()},
                          transports={r: nccl_transport(t) for r, t in texts.items()} if plan.backend == "nccl" else {})
    labels = {r: c.label for r, c in cmds.items()}
    if failed_start:
        r = min(failed_start)
        res.failed_node, res.message = r, f"node {r} ({labels[r]}): {failed_start[r]}"
    elif all(v == 0 for v in rcs.values()) and len(recs) == plan.world_size:
        res.ok = True
        res.meet_s = max(x["meet_s"] for x in recs.values())
        bws = [x["busbw_gbps"] for x in recs.values() if x["busbw_gbps"] is not None]
        res.busbw_gbps = min(bws) if bws else None
        res.size_mb = min(float(x.get("size_mb") or size_mb) for x in recs.values())
        res.message = (f"rendezvous in {res.meet_s:.1f}s, all-reduce bus bandwidth "
                       f"{res.busbw_gbps if res.busbw_gbps is None else round(res.busbw_gbps, 2)} Gbit/s "
                       f"at {res.size_mb:g} MB ({plan.backend}, world {plan.world_size})")
        if res.size_mb < size_mb:
            res.message += (f"; the link was too slow for {size_mb:g} MB within {allreduce_budget_s:g} s, so the "
                            "figure reads low for the run's buckets")
        if res.transports:
            res.message += "; NCCL network: " + ", ".join(
                f"{labels[r]} {'NET/' + v if v else 'not reported'}" for r, v in sorted(res.transports.items()))
    else:
        bad = [r for r, v in rcs.items() if v not in (None, 0)] or [r for r, v in rcs.items() if v is None]
        diags = {r: diagnose(texts.get(r, "")) for r in bad}
        # Blame the node with a root cause over nodes that only saw its consequences.
        bad.sort(key=lambda r: (diags[r] is None or diags[r].code in CONSEQUENTIAL, r))
        r = bad[0]
        res.failed_node, res.diagnosis = r, diags[r]
        why = diags[r].cause if diags[r] else (msg or f"exit code {rcs[r]}")
        res.message = f"node {r} ({labels[r]}) failed the rehearsal: {why}" + (f" ({msg})" if msg and diags[r] else "")
        if diags[r]:
            res.message += f". Fix: {diags[r].fix}"
    if res.ok:  # keep the logs of a failed rehearsal for the user; drop a good one's
        on_nodes(lambda r: transports[r].run(["rm", "-rf", "--", dirs[r]], timeout=15), sorted(cmds), timeout=20)
    if facts is not None:
        facts.rehearsal_ok = res.ok
        facts.rehearsal_bandwidth_gbps = res.busbw_gbps
        facts.rehearsal_size_mb = res.size_mb if res.busbw_gbps is not None else None
        facts.rehearsal_nodes = len(plan.nodes)
    return res


def add_rehearsal(preset: Preset, transports: dict[int, Transport], rep: CheckReport,
                  *, local_python: str | None = None) -> None:
    """Run the rehearsal (rendezvous + all-reduce with the plan's own settings) and
    put its verdict into the report. Only worth it once every node answered and the
    other checks passed."""
    import os

    from qwen_tui.plan.launch import make_plan

    # a run id of its own: it names the rehearsal's containers, which another rehearsal on the nodes must not replace
    plan = make_plan(preset, run_id=f"rehearsal-{uuid.uuid4().hex[:8]}", local_run_dir=os.getcwd(), facts=rep.facts,
                     local_python=local_python)
    r = rehearse(plan, transports, pythons={c.rank: c.argv[0] for c in plan.nodes}, facts=rep.facts,
                 deadline_s=preset.network.rdzv_timeout + 30)
    for i in range(len(preset.cluster.nodes)):
        rep._checked.setdefault(i, set()).add("rehearsal")
    if r.ok:
        rep.findings.append(Finding(INFO, "REHEARSAL", r.message, "", 0, "rehearsal"))
        rep.findings += nccl_network_findings(rep.labels, rep.facts, r.transports)
    else:
        tail = "\n".join(r.log_tails.get(r.failed_node, [])[-8:]) if r.failed_node is not None else ""
        rep.findings.append(Finding(ERROR, "REHEARSAL_FAILED", r.message + ("\n" + tail if tail else ""),
                                    r.diagnosis.fix if r.diagnosis else "", r.failed_node, "rehearsal"))
