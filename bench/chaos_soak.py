"""A chaos soak: real training runs on a namespace cluster of 3 nodes for a chosen time, with random faults
injected at random moments, and one table of what each fault did to the run.

    sudo python bench/chaos_soak.py --minutes 20 --seed 1

Run as root (network namespaces, sshd, iptables, cgroups). It brings up its own cluster with the test suite's
implementation (tests/support/netns.py, field_run.py, login_user.py, with tests/ on sys.path: one namespace cluster
implementation for the tests and the bench), sets up SSH keys from password-only nodes as `qwen-tui` does,
and runs `qwen-tui replay` as a login user over SSH to every node, the master too. Each run trains the tiny
model on CPU over gloo with training.restarts, a checkpoint every few steps and short monitor bounds; runs
follow one another until the time is up. Everything it made is torn down at the end, on Ctrl-C too.

Faults, one at a time, each kind once per round in a seeded order (the same seed draws the same
faults, nodes, gaps and durations; what the run makes of them varies with the machine's load):
  ssh       every packet to one node's sshd dropped for 10-60 s (port 22 only: training traffic untouched)
  hang      one rank stopped (SIGSTOP) until the watchdog names it, then let go
  kill      one node's torchrun agent and ranks SIGKILLed
  throttle  one node's ranks capped at a few percent of a CPU (cgroup) for a while
  lost-reset   one node's machine gone as a crashed or rebooted one (processes killed, TCP answered with resets)
  lost-silent  one node's machine gone silent (every packet dropped, processes frozen); either until the run
               relaunches without it, then it comes back for the next run (never the master: its address is fixed)

Each fault's outcome comes from the run directory (state.json's attempts and their causes, notices.jsonl):
survived unnoticed, warned, restarted, failed. Beside it: the steps trained again after a relaunch (from
metrics.jsonl), whether every checkpoint the run names is complete, and the processes of a finished run left
on any node. The totals say how many healthy runs the monitor killed (an SSH cut shorter than the unreachable
bound, or a throttle, must never end one), how many injected hangs were named, how many lost machines were named
alone, and the orphans. The table and every record go to bench/results/chaos_soak-DATE.json and .md; each run's directory and replay log are
kept under --evidence.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT), str(ROOT / "bench")]

import chaos_faults as cf  # noqa: E402
import chaos_report as cr  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Run as root.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--minutes", type=float, default=20, help="how long faults are injected")
    p.add_argument("--seed", type=int, default=1, help="seeds the faults, the nodes hit, the gaps and durations")
    p.add_argument("--faults", default=",".join(cf.KINDS),
                   help=f"the kinds to inject, comma-separated, of: {', '.join(cf.KINDS)}")
    p.add_argument("--gap", type=float, nargs=2, default=(2.0, 8.0), metavar=("MIN", "MAX"),
                   help="seconds between one fault's effects settling and the next fault")
    p.add_argument("--ssh-seconds", type=float, nargs=2, default=(10.0, 60.0), metavar=("MIN", "MAX"),
                   help="how long an SSH cut lasts")
    p.add_argument("--throttle-seconds", type=float, nargs=2, default=(20.0, 45.0), metavar=("MIN", "MAX"),
                   help="how long a CPU throttle lasts")
    p.add_argument("--throttle-percent", type=int, default=10, help="the throttled node's CPU cap, %% of one CPU")
    p.add_argument("--steps", type=int, default=1200, help="max_steps of each run")
    p.add_argument("--save-steps", type=int, default=20, help="a checkpoint every this many steps")
    p.add_argument("--restarts", type=int, default=5, help="training.restarts of each run (at least 2)")
    p.add_argument("--unreachable-timeout", type=int, default=45, help="monitor.unreachable_timeout, seconds")
    p.add_argument("--on-unreachable", choices=("stop", "keep"), default="stop", help="monitor.on_unreachable")
    p.add_argument("--hang-timeout", type=int, default=20, help="monitor.hang_timeout, seconds")
    p.add_argument("--on-hang", choices=("alert", "stop", "restart"), default="restart", help="monitor.on_hang")
    p.add_argument("--drain", type=float, default=120.0,
                   help="at the end, seconds the last run may take to finish before it is stopped")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results",
                   help="where chaos_soak-DATE.json and .md go")
    p.add_argument("--evidence", type=Path, default=None,
                   help="where each run's directory and replay log are kept (default: a new directory under /tmp)")
    a = p.parse_args(argv)
    kinds = [k.strip() for k in a.faults.split(",") if k.strip()]
    bad = [k for k in kinds if k not in cf.KINDS]
    if bad or not kinds:
        p.error(f"--faults: unknown kind(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(cf.KINDS)}")
    a.kinds = kinds
    if a.restarts < 2:
        p.error("--restarts must be at least 2: a soak run must survive more than one fault that ends an attempt")
    for name in ("gap", "ssh_seconds", "throttle_seconds"):
        lo, hi = getattr(a, name)
        if not 0 <= lo <= hi:
            p.error(f"--{name.replace('_', '-')}: MIN {lo:g} and MAX {hi:g} must satisfy 0 <= MIN <= MAX")
    if a.minutes <= 0 or a.steps < 1 or a.save_steps < 1 or not 1 <= a.throttle_percent <= 100:
        p.error("--minutes, --steps, --save-steps must be positive and --throttle-percent within 1..100")
    return a


class Soak:
    def __init__(self, args: argparse.Namespace, field, evidence: Path):
        self.a, self.field, self.evidence = args, field, evidence
        self.rng = random.Random(args.seed)
        self.stop = threading.Event()
        self.bag: list[str] = []  # the kinds left to inject in this round
        self.not_launched: list[dict] = []  # runs whose replay ended before the launch, and why
        self.faults: list[dict] = []
        self.runs: list[dict] = []
        self.t0 = time.time()
        self.deadline = time.monotonic() + args.minutes * 60

    def say(self, text: str) -> None:
        print(f"[{(time.time() - self.t0) / 60:5.1f} min] {text}", file=sys.stderr, flush=True)

    def time_left(self) -> bool:
        return time.monotonic() < self.deadline and not self.stop.is_set()

    def preset(self, name: str):
        a = self.a
        return self.field.preset(name, max_steps=a.steps, save_strategy="steps", save_steps=a.save_steps,
                                 save_total_limit=None, restarts=a.restarts,
                                 monitor={"unreachable_timeout": a.unreachable_timeout,
                                          "on_unreachable": a.on_unreachable, "hang_timeout": a.hang_timeout,
                                          "on_hang": a.on_hang})  # the nodes run a copy of this checkout's worker (field_run's runtime)

    # ------------------------------------------------------------ one fault
    def draw(self) -> dict:
        """Every random figure of one fault, drawn in one fixed order whatever the fault turns out to be."""
        a, r = self.a, self.rng
        if not self.bag:  # every kind once per round, in a seeded order: a short soak still sees each one
            self.bag = r.sample(a.kinds, len(a.kinds))
        return {"gap": r.uniform(*a.gap), "kind": self.bag.pop(),
                "node": r.randrange(len(self.field.cluster.nodes)), "ssh_s": r.uniform(*a.ssh_seconds),
                "throttle_s": r.uniform(*a.throttle_seconds)}

    def inject(self, live: cf.Live, d: dict) -> cf.Fault:
        a = self.a
        if d["kind"] == "ssh":
            return cf.ssh_cut(live, d["node"], d["ssh_s"])
        if d["kind"] == "hang":
            # the watchdog's bound, a heartbeat read, staleness, the stacks' collection: then it is not named
            return cf.hang(live, d["node"], bound=a.hang_timeout + 5 + 10 + 60 + 30)
        if d["kind"] == "kill":
            return cf.kill(live, d["node"])
        if d["kind"].startswith("lost-"):
            # the master's machine cannot be left out: the soak's preset fixes network.master_addr to it
            return cf.lost(live, d["node"] or 1 + (len(self.faults) % 2), d["kind"].split("-", 1)[1])
        return cf.throttle(live, d["node"], d["throttle_s"], a.throttle_percent,
                           tag=f"qt-soak-{os.getpid()}-{len(self.faults)}")

    # ------------------------------------------------------------ one run
    def one_run(self, k: int) -> None:
        name = f"soak{k}"
        log = self.evidence / f"{name}.log"
        rp = self.field.replay(self.preset(name), log)
        mine: list[cf.Fault] = []
        live = None
        try:
            try:
                rd = rp.run_dir(bound=180)
            except AssertionError as e:  # replay ended before launching (its checks refused), or hung in them
                self.say(f"run {k} not launched: {str(e).splitlines()[0]}; its log: {log}")
                self.not_launched.append({"run": k, "why": str(e)[-3000:]})
                if len(self.not_launched) >= 3:
                    raise RuntimeError(f"{len(self.not_launched)} runs were not launched; the last one's log: "
                                       f"{log}") from None
                return
            live = cf.Live(self.field, rp, rd, self.stop.is_set)
            self.say(f"run {k} ({rd.name}) launched")
            if not live.wait(live.training, 300) and not self.stop.is_set():
                self.say(f"run {k}: no step within 300 s (ended: {live.ended()})")
            while self.time_left() and not live.ended():
                d = self.draw()
                live.wait(lambda: False, d["gap"])
                if not live.wait(live.training, 180) or not self.time_left():
                    continue
                try:
                    f = self.inject(live, d)
                except LookupError as e:  # the node's ranks ended between the check and the fault
                    self.say(f"run {k}: {d['kind']} on node {d['node']} not injected: {e}")
                    continue
                mine.append(f)
                self.say(f"run {k}: {f.kind} on node {f.node}, {f.duration:.0f} s; state "
                         f"{live.state().get('status')}, attempt {live.attempt()}")
            if not live.ended():
                self.say(f"run {k}: time is up; it may take {self.a.drain:g} s to finish")
                live.wait(lambda: False, 0 if self.stop.is_set() else self.a.drain, every=1.0)
        finally:
            rp.close()  # SIGTERM: replay stops every node of a run still going
        rc = rp.proc.returncode
        orphans = cf_no_job_left(self.field.cluster)
        if orphans:
            self.say(f"run {k}: ORPHANS left: {orphans}")
            kill_all(orphans)
        if live is not None:
            self.judge(k, live, rc, mine, orphans)
            keep = self.evidence / name
            shutil.copytree(live.run_dir, keep, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.sock", "*.lock"))
            worker = self.field.live_metrics(live.run_id)
            if worker.is_file():
                shutil.copy2(worker, keep / "metrics.worker.jsonl")

    def judge(self, k: int, live: cf.Live, rc, mine: list[cf.Fault], orphans: dict) -> None:
        import torch

        st = live.state()
        attempts = [a for a in st.get("attempts") or [] if isinstance(a, dict)]
        notices = cf.records(live.run_dir / "notices.jsonl")
        metrics = cf.records(self.field.live_metrics(live.run_id))
        lost = cr.steps_lost(attempts, metrics)
        names = cr.named_checkpoints(attempts, metrics)
        checkpoints = cr.check_checkpoints(names, load_pt=lambda p: torch.load(p, map_location="cpu",
                                                                                 weights_only=True))
        fdicts = []
        for f in mine:
            d = f.to_dict()
            d["outcome"], d["evidence"] = cr.classify(d, attempts, notices)
            named = cr.naming_hang(d, notices) if f.kind == "hang" else None
            d["named"] = None if f.kind != "hang" else named is not None
            if f.kind in cr.LOST_KINDS:
                d["detail"]["named_after_s"] = cr.machine_named(d, attempts)
                d["named"] = d["detail"]["named_after_s"] is not None
            if named is not None:  # the stacks directory, as the notice names it (under the run directory)
                where = Path(str((named.get("details") or {}).get("stacks") or ""))
                d["detail"]["stacks"] = cr.stacks_answered(live.run_dir / "stacks" / where.name)
            nxt = d["evidence"].get("attempt")
            d["steps_lost"] = lost.get(nxt + 1, 0) if d["outcome"] == "restarted" and nxt else 0
            d["run_no"], d["at_s"] = str(k), d["at"] - self.t0
            fdicts.append(d)
        healthy_killed, unexplained = cr.failures_unexplained(fdicts, attempts, self.a.unreachable_timeout,
                                                              first=len(self.faults) + 1)
        run = {"run": k, "id": live.run_id, "status": st.get("status"), "replay_rc": rc,
               "attempts": attempts, "steps_lost": lost, "checkpoints": checkpoints,
               "every_step_once": cr.every_step_once(attempts, metrics), "orphans": orphans,
               "healthy_killed": healthy_killed, "unexplained": unexplained,
               "unanswering": cr.unanswering(fdicts, notices),
               "notices": [{k2: n.get(k2) for k2 in ("kind", "node", "at", "attempt", "text")} for n in notices]}
        self.faults += fdicts
        self.runs.append(run)
        bad = {n: v for n, v in checkpoints.items() if v}
        self.say(f"run {k} ended {st.get('status')} (replay rc {rc}) after {len(attempts)} attempt(s); "
                 f"{len(fdicts)} fault(s): {', '.join(f['kind'] + '->' + f['outcome'] for f in fdicts) or 'none'}"
                 + (f"; DAMAGED checkpoints {bad}" if bad else "") + (f"; {healthy_killed}" if healthy_killed else ""))

    def run(self) -> None:
        k = 0
        while self.time_left():
            k += 1
            self.one_run(k)


def cf_no_job_left(cluster) -> dict:
    from support.field_run import no_job_left

    return {str(i): p for i, p in no_job_left(cluster, 60).items()}


def kill_all(left: dict) -> None:
    for pids in left.values():
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue


def bring_up(base: Path):
    """The namespace cluster, keys set up from password-only nodes (as the `keyed` fixture does), and the
    login user's side of it."""
    from qwen_tui.nodes.keys import setup_keys
    from qwen_tui.preset.schema import Preset
    from support.cluster import preset_dict
    from support.field_run import FieldCluster
    from support.netns import NetnsCluster

    password = secrets.token_urlsafe(18)  # in memory only; the nodes keep its hash
    cluster = NetnsCluster(base / "nodes", 3, password=password)
    try:
        cluster.up()
        sshdir = base / "ssh"
        sshdir.mkdir()
        lines = []
        for n in cluster.nodes:
            lines += [f"Host {n.hostname}", f"    HostName {n.addr}", "    User root", "    Port 22",
                      f"    IdentityFile {sshdir / 'id_ed25519'}", "    ConnectTimeout 5", ""]
        (sshdir / "config").write_text("\n".join(lines))
        report = setup_keys(Preset.model_validate(preset_dict(cluster, sshdir)), password, accept_new_host_keys=True)
        failed = getattr(report.installed, "failed", None)
        if failed:
            raise RuntimeError(f"key setup failed on nodes: {failed}")
        return cluster, FieldCluster(cluster, sshdir)
    except BaseException:
        cluster.down()
        raise


def write_results(soak: Soak, args: argparse.Namespace, load: tuple) -> tuple[Path, Path]:
    runs = {str(r["run"]): r for r in soak.runs}
    for f in soak.faults:
        f["run"] = f["run_no"]
    t = cr.totals(soak.faults, soak.runs, args.unreachable_timeout)
    date = time.strftime("%Y-%m-%d", time.gmtime(soak.t0))
    args.out.mkdir(parents=True, exist_ok=True)
    js, md = args.out / f"chaos_soak-{date}.json", args.out / f"chaos_soak-{date}.md"
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    js.write_text(json.dumps({"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(soak.t0)),
                              "minutes": round((time.time() - soak.t0) / 60, 1), "config": config,
                              "load_average_start_end": load, "cpus": os.cpu_count(), "totals": t,
                              "not_launched": soak.not_launched,
                              "faults": soak.faults, "runs": soak.runs}, indent=1, default=str))
    lines = cr.totals_lines(t) + ([f"runs not launched (their checks refused): {len(soak.not_launched)}"]
                                  if soak.not_launched else [])
    cmd = f"python bench/chaos_soak.py --minutes {args.minutes:g} --seed {args.seed}"
    md.write_text("\n".join([
        f"# Chaos soak, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(soak.t0))}", "",
        f"`{cmd}` (faults: {', '.join(args.kinds)}); 3 namespace nodes, tiny model on CPU over gloo, "
        f"{args.steps} steps a run, a checkpoint every {args.save_steps}, restarts {args.restarts}, "
        f"unreachable_timeout {args.unreachable_timeout} s ({args.on_unreachable}), hang_timeout "
        f"{args.hang_timeout} s ({args.on_hang}); {os.cpu_count()} CPU cores, load average {load[0]:.1f} at the "
        f"start and {load[1]:.1f} at the end.", "",
        cr.markdown_table(soak.faults, runs), "", *[f"- {ln}" for ln in lines], ""]))
    print(cr.text_table(soak.faults, runs))
    print()
    print("\n".join(lines))
    return js, md


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("chaos_soak: run as root (network namespaces, sshd, iptables and cgroups need it)", file=sys.stderr)
        return 2
    evidence = args.evidence or Path(tempfile.mkdtemp(prefix="chaos-soak-evidence-"))
    evidence.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="qt-soak-"))
    load0 = os.getloadavg()[0]
    cluster = field = soak = error = None
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        cluster, field = bring_up(base)
        soak = Soak(args, field, evidence)

        def interrupted(signum, frame):
            if soak.stop.is_set():  # a second Ctrl-C: no more waiting, straight to the teardown
                raise KeyboardInterrupt
            soak.say("interrupted: ending the current fault and run, then tearing everything down "
                     "(Ctrl-C again to skip the waits)")
            soak.stop.set()

        for s in old:
            signal.signal(s, interrupted)
        soak.say(f"cluster up ({', '.join(n.addr for n in cluster.nodes)}); evidence in {evidence}")
        try:
            soak.run()
        except (Exception, KeyboardInterrupt) as e:  # what was measured so far is still written
            import traceback

            traceback.print_exc()
            error = f"{type(e).__name__}: {e}"
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if field is not None:
            field.close()
        if cluster is not None:
            cluster.down()
        shutil.rmtree(base, ignore_errors=True)
    js, md = write_results(soak, args, (load0, os.getloadavg()[0]))
    print(f"\nwritten: {js} and {md}; run directories and replay logs in {evidence}")
    if error:
        print(f"the soak ended early: {error}", file=sys.stderr)
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
