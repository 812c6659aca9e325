"""What bench/chaos_soak.py concludes from a run directory after the faults: each fault's outcome, the steps
trained again after each relaunch, whether every checkpoint the run names is complete, and the totals. Pure
reads of the records (state.json's attempts, notices.jsonl, metrics.jsonl, the checkpoint directories):
never the colours of a face's output.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable
from pathlib import Path

OUTCOMES = ("survived unnoticed", "warned", "restarted", "failed")
MONITOR_CAUSES = ("UNREACHABLE", "HANG", "HANG_STOPPED", "MACHINE_LOST")  # an attempt the monitor itself ended
LOST_KINDS = ("lost-reset", "lost-silent")
CKPT_NAME = re.compile(r"checkpoint-(\d+)$")
SLACK_S = 2.0  # an attempt may be recorded as ended a moment after the soak stopped watching its fault


# ------------------------------------------------------------------ outcomes
def fault_window(fault: dict, attempts: list[dict]) -> list[dict]:
    """The attempts that ended (not ok) while the fault was on or being watched."""
    lo, hi = fault["at"], fault["until"] + SLACK_S
    return [a for a in attempts if isinstance(a.get("ended"), (int, float)) and lo <= a["ended"] <= hi
            and a.get("status") != "ok"]


# The notices that answer each kind of fault, and whether they must name the node hit. Others that come in a
# fault's window (a STRAGGLER on a loaded machine during an SSH cut) are not its outcome: they are counted apart.
ANSWERS = {"ssh": ({"UNREACHABLE", "REACHABLE", "UNREACHABLE_BOUND"}, True),
           "hang": ({"HANG", "HANG_OVER"}, False),  # whom the watchdog names is judged by hang_named
           "kill": ({"UNREACHABLE", "REACHABLE", "UNREACHABLE_BOUND", "HANG", "HANG_OVER"}, False),
           "throttle": ({"STRAGGLER", "STRAGGLER_OVER"}, True),
           **{k: ({"UNREACHABLE", "REACHABLE", "UNREACHABLE_BOUND", "MACHINE_LOST", "HANG", "HANG_OVER"}, False)
              for k in LOST_KINDS}}


def answers(fault: dict, notices: list[dict]) -> list[dict]:
    """The notices in the fault's window that answer it."""
    lo, hi = fault["at"], fault["until"] + SLACK_S
    kinds, same_node = ANSWERS[fault["kind"]]
    return [n for n in notices if lo <= float(n.get("at") or 0) <= hi and n.get("kind") in kinds
            and (not same_node or n.get("node") == fault["node"])]


def unanswering(faults: list[dict], notices: list[dict]) -> dict[str, int]:
    """kind -> how many notices answered no fault: said while nothing was injected, or of another kind or
    node than the fault on at the time (a warning of a healthy node)."""
    used = {id(n) for f in faults for n in answers(f, notices)}
    out: dict[str, int] = {}
    for n in notices:
        if id(n) not in used:
            out[n.get("kind", "?")] = out.get(n.get("kind", "?"), 0) + 1
    return out


def classify(fault: dict, attempts: list[dict], notices: list[dict]) -> tuple[str, dict]:
    """(outcome, evidence): restarted or failed when an attempt ended in the fault's window (its `next` says
    which), warned when a notice answered it, else survived unnoticed."""
    said = answers(fault, notices)
    ev = {"notices": [f"{n['kind']} n{n.get('node')}" for n in said]}
    ended = fault_window(fault, attempts)
    if ended:
        a = ended[0]
        ev.update(attempt=a.get("attempt"), cause=a.get("cause"), failed_node=a.get("failed_node"),
                  next=a.get("next"), message=a.get("message"))
        if len(ended) > 1:
            ev["later_attempts_failed"] = [b.get("attempt") for b in ended[1:]]
        # the run ended failed in the window (the first relaunch may have failed again): failed
        if any(b.get("status") == "failed" and str(b.get("next") or "").startswith("none") for b in ended):
            return "failed", ev
        return "restarted", ev
    return ("warned" if said else "survived unnoticed"), ev


def naming_hang(fault: dict, notices: list[dict]) -> dict | None:
    """The HANG notice in the fault's window that names the stopped rank's node and the rank itself."""
    lo, hi = fault["at"], fault["until"] + SLACK_S
    rank = fault["detail"].get("rank")
    for n in notices:
        if n.get("kind") == "HANG" and lo <= float(n.get("at") or 0) <= hi and n.get("node") == fault["node"]:
            if rank in (n.get("details") or {}).get("culprits", []):
                return n
    return None


def hang_named(fault: dict, notices: list[dict]) -> bool:
    return naming_hang(fault, notices) is not None


def machine_named(fault: dict, attempts: list[dict]) -> float | None:
    """For a machine made to vanish: seconds until the attempt it hit ended blaming that machine alone (cause
    MACHINE_LOST, the node's label), or None when no attempt did. The soak's nodes are labelled node0, node1, ..."""
    for a in fault_window(fault, attempts):
        if a.get("cause") == "MACHINE_LOST" and a.get("failed_node") == f"node{fault['node']}":
            return round(float(a["ended"]) - fault["at"], 1)
    return None


def stacks_answered(stacks_dir: Path) -> str | None:
    """"K/N": how many ranks left their stack in a hang's stacks directory (its summary.json), None without one."""
    try:
        summary = json.loads((stacks_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return f"{sum(1 for v in summary.values() if str(v).startswith('ok'))}/{len(summary)}"


def justified(fault: dict | None, unreachable_bound: float) -> bool:
    """Whether a fault is one that should end an attempt: a node killed, a rank stopped (the watchdog's job),
    or SSH cut for at least the unreachable bound. An SSH blip shorter than the bound, a throttle, or no
    fault at all must never end one."""
    if fault is None:
        return False
    return fault["kind"] in ("kill", "hang", *LOST_KINDS) or \
        (fault["kind"] == "ssh" and fault["duration"] >= unreachable_bound)


def failures_unexplained(faults: list[dict], attempts: list[dict], unreachable_bound: float,
                         first: int = 1) -> tuple[list[dict], list[dict]]:
    """(healthy attempts the monitor ended, other failures no fault explains). A fault that should end an attempt
    (justified) explains the first attempt that failed in its window, not the relaunches after it: those failed
    on their own. `first`: the number of faults[0] in the soak's table."""
    explained: set[int] = set()
    healthy_killed, unexplained = [], []
    for a in attempts:
        if a.get("status") != "failed" or not isinstance(a.get("ended"), (int, float)):
            continue
        i, hit = next(((i, f) for i, f in enumerate(faults) if f["at"] <= a["ended"] <= f["until"] + SLACK_S),
                      (None, None))
        if i is not None and i not in explained and justified(hit, unreachable_bound):
            explained.add(i)
            continue
        entry = {"attempt": a.get("attempt"), "cause": a.get("cause"), "message": a.get("message"),
                 "fault": None if i is None else i + first}
        (healthy_killed if a.get("cause") in MONITOR_CAUSES else unexplained).append(entry)
    return healthy_killed, unexplained


# ------------------------------------------------------------------ steps
def step_records(metrics: Iterable[dict]) -> list[dict]:
    return [r for r in metrics if "loss" in r and "event" not in r and isinstance(r.get("step"), int)]


def resume_step(attempt: dict) -> int:
    m = CKPT_NAME.search(str(attempt.get("resume_from") or ""))
    return int(m.group(1)) if m else 0


def steps_lost(attempts: list[dict], metrics: Iterable[dict]) -> dict[int, int]:
    """attempt K (K >= 2) -> the steps attempt K-1 had trained past the checkpoint K resumed from: trained
    again by K. Records are told apart by their time against each attempt's start."""
    steps = step_records(metrics)
    out = {}
    for prev, cur in zip(attempts, attempts[1:]):
        lo, hi = prev.get("started") or 0, cur.get("started") or float("inf")
        done = [r["step"] for r in steps if lo <= float(r.get("time") or 0) < hi]
        out[int(cur["attempt"])] = max(0, max(done, default=0) - resume_step(cur))
    return out


def every_step_once(attempts: list[dict], metrics: Iterable[dict]) -> str | None:
    """None when the last attempt's records plus the earlier ones up to each resume hold every step from 1 on
    exactly once; else what is missing or doubled (a blip must not lose a record)."""
    steps = step_records(metrics)
    if not steps:
        return "no step recorded"
    kept: dict[int, int] = {}
    for i, a in enumerate(attempts):
        lo = a.get("started") or 0
        hi = attempts[i + 1].get("started") if i + 1 < len(attempts) else float("inf")
        until = resume_step(attempts[i + 1]) if i + 1 < len(attempts) else None
        for r in steps:
            if lo <= float(r.get("time") or 0) < hi and (until is None or r["step"] <= until):
                kept[r["step"]] = kept.get(r["step"], 0) + 1
    top = max(kept)
    missing = [s for s in range(1, top + 1) if s not in kept]
    doubled = [s for s, c in kept.items() if c > 1]
    if missing or doubled:
        return f"missing steps {missing[:10]}, doubled {doubled[:10]}"
    return None


# ------------------------------------------------------------------ checkpoints
def named_checkpoints(attempts: list[dict], metrics: Iterable[dict]) -> list[str]:
    """Every checkpoint the run names: each checkpoint record of the worker, each attempt's resume_from."""
    names = [str(r["path"]) for r in metrics if r.get("event") == "checkpoint" and r.get("path")]
    names += [str(a["resume_from"]) for a in attempts if a.get("resume_from")]
    return sorted(set(names), key=lambda p: (len(p), p))


def _safetensors_whole(path: Path) -> bool:
    """The header's declared size and the data offsets fit the file exactly."""
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return False
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    return path.stat().st_size == 8 + n + end


def checkpoint_problem(d: Path, load_pt=None) -> str | None:
    """None when checkpoint directory `d` is complete as training/checkpoints/checkpointer.py writes it: its state file
    (step matching the name), the optimizer and scheduler (or DeepSpeed's state), every rank's RNG state, the
    model or adapter weights whole, the tokenizer. load_pt(path) loads a torch file (raises when damaged)."""
    if not d.is_dir():
        return "missing"
    state_f = next((d / n for n in ("finetune_state.json", "trainer_state.json") if (d / n).is_file()), None)
    if state_f is None:
        return "no finetune_state.json"
    try:
        state = json.loads(state_f.read_text())
    except ValueError as e:
        return f"{state_f.name} unreadable: {e}"
    m = CKPT_NAME.search(d.name)
    if not m or state.get("step") != int(m.group(1)):
        return f"{state_f.name} says step {state.get('step')}"
    world = state.get("world_size")
    if not isinstance(world, int) or world < 1:
        return f"{state_f.name} has no world_size"
    need = [f"rng_state_{r}.pth" for r in range(world)]
    need += ["ds"] if (d / "ds").is_dir() else ["optimizer.pt", "scheduler.pt"]
    need += ["tokenizer_config.json"]
    missing = [n for n in need if not (d / n).exists()]
    if missing:
        return "no " + ", ".join(missing)
    weights = sorted(d.glob("adapter_model.safetensors")) or sorted(d.glob("model*.safetensors"))
    if not weights:
        return "no model or adapter weights"
    bad = [w.name for w in weights if not _safetensors_whole(w)]
    if bad:
        return "damaged " + ", ".join(bad)
    if load_pt is not None:
        for n in need:
            p = d / n
            if p.suffix in (".pt", ".pth"):
                try:
                    load_pt(p)
                except Exception as e:  # any failure to load is the finding, named with the file
                    return f"{n} does not load: {type(e).__name__}: {e}"
    return None


def check_checkpoints(names: list[str], load_pt=None) -> dict[str, str | None]:
    return {n: checkpoint_problem(Path(n), load_pt) for n in names}


# ------------------------------------------------------------------ totals and table
def totals(faults: list[dict], runs: list[dict], unreachable_bound: float) -> dict:
    by_kind: dict[str, int] = {}
    outcomes: dict[str, int] = {o: 0 for o in OUTCOMES}
    for f in faults:
        by_kind[f["kind"]] = by_kind.get(f["kind"], 0) + 1
        outcomes[f["outcome"]] += 1
    hangs = [f for f in faults if f["kind"] == "hang"]
    lost = [f for f in faults if f["kind"] in LOST_KINDS]
    ck = [v for r in runs for v in r["checkpoints"].values()]
    return {
        "faults": len(faults), "by_kind": by_kind, "outcomes": outcomes,
        "healthy_killed_by_monitor": sum(len(r["healthy_killed"]) for r in runs),
        "unexplained_failures": sum(len(r["unexplained"]) for r in runs),
        "hangs_injected": len(hangs), "hangs_named": sum(1 for f in hangs if f.get("named")),
        "machines_lost": len(lost), "machines_named": sum(1 for f in lost if f.get("named")),
        "steps_lost": sum(f.get("steps_lost") or 0 for f in faults),
        "checkpoints": len(ck), "checkpoints_intact": sum(1 for v in ck if v is None),
        "orphans": sum(len(p) for r in runs for p in r["orphans"].values()),
        "runs": len(runs), "runs_ok": sum(1 for r in runs if r["status"] == "ok"),
        "notices_answering_no_fault": _sum_counts(r["unanswering"] for r in runs),
        "unreachable_bound_s": unreachable_bound,
    }


def _sum_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


COLUMNS = ("#", "kind", "node", "run", "at", "lasted", "outcome", "what the run did", "steps lost",
           "checkpoints intact", "orphans")


def rows(faults: list[dict], runs: dict[str, dict]) -> list[list[str]]:
    out = []
    for i, f in enumerate(faults, 1):
        r = runs.get(f["run"], {})
        ck = r.get("checkpoints", {})
        parts = []
        if f["kind"] == "hang":
            parts.append(("named " if f.get("named") else "NOT named ") + f"rank {f['detail'].get('rank')}"
                         + (f" after {f['detail']['hang_after_s']:.0f} s" if f["detail"].get("hang_after_s") else "")
                         + (f", stacks {f['detail']['stacks']}" if f["detail"].get("stacks") else "")
                         + _phases_note(f))
        elif f["kind"] in LOST_KINDS:
            after = f["detail"].get("named_after_s")
            parts.append(f"named node {f['node']} after {after:.0f} s" if f.get("named") and after is not None
                         else "NOT named")
            parts += list(dict.fromkeys(n.split()[0] for n in f["evidence"].get("notices", [])))
        else:
            parts += list(dict.fromkeys(n.split()[0] for n in f["evidence"].get("notices", [])))  # in order said
        if f["outcome"] in ("restarted", "failed"):
            parts.append(f"attempt ended: {f['evidence'].get('cause') or 'node failed'}")
            if f["evidence"].get("later_attempts_failed"):
                parts.append(f"relaunches failed: attempts {', '.join(map(str, f['evidence']['later_attempts_failed']))}")
        did = "; ".join(parts)
        out.append([str(i), f["kind"], str(f["node"]), f["run_no"], f"{int(f['at_s'] // 60)}:{int(f['at_s'] % 60):02d}",
                    f"{f['duration']:.0f} s", f["outcome"], did or "-", str(f.get("steps_lost") or 0),
                    f"{sum(1 for v in ck.values() if v is None)}/{len(ck)}",
                    str(sum(len(p) for p in r.get("orphans", {}).values())) if r else "-"])
    return out


def _phases_note(f: dict) -> str:
    """For a hang not named: the phase the other ranks' heartbeats were in at the bound (a checkpoint gets the
    watchdog's longer bound)."""
    ph = {r: p for r, p in (f["detail"].get("phases") or {}).items() if r != str(f["detail"].get("rank"))}
    common = sorted(set(ph.values()))
    return f" (the others in phase {'/'.join(common)})" if common and not f.get("named") else ""


def text_table(faults: list[dict], runs: dict[str, dict]) -> str:
    body = rows(faults, runs)
    widths = [max(len(c), *(len(r[i]) for r in body)) if body else len(c) for i, c in enumerate(COLUMNS)]
    def line(cells):
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(COLUMNS), line(["-" * w for w in widths])] + [line(r) for r in body])


def markdown_table(faults: list[dict], runs: dict[str, dict]) -> str:
    body = rows(faults, runs)
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    out += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in body]
    return "\n".join(out)


def totals_lines(t: dict) -> list[str]:
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(t["by_kind"].items()))
    outs = ", ".join(f"{k} {v}" for k, v in t["outcomes"].items())
    return [
        f"faults injected: {t['faults']} ({kinds}); outcomes: {outs}",
        f"healthy runs killed by the monitor: {t['healthy_killed_by_monitor']} "
        f"(an SSH cut shorter than the {t['unreachable_bound_s']:g} s bound or a throttle that ended an attempt); "
        f"other unexplained failures: {t['unexplained_failures']}",
        f"hangs injected: {t['hangs_injected']}, named (node and rank): {t['hangs_named']}",
        f"machines lost: {t.get('machines_lost', 0)}, named alone (MACHINE_LOST, that node): "
        f"{t.get('machines_named', 0)}",
        f"steps trained again after relaunches: {t['steps_lost']}; checkpoints intact: "
        f"{t['checkpoints_intact']}/{t['checkpoints']}; orphans left: {t['orphans']}",
        f"runs: {t['runs']} ({t['runs_ok']} finished ok); notices that answered no fault: "
        + (", ".join(f"{k} {v}" for k, v in sorted(t["notices_answering_no_fault"].items())) or "none"),
    ]
