"""Network checks between the master (node 0) and the workers.

- ports: short-lived listeners (the master port on the master; a sample of
  ephemeral ports, where NCCL and gloo put their own sockets, on every node),
  and connects from every other node within one bounded window;
- firewall rules that could drop the job's traffic (iptables, nft, ufw), where
  they are readable;
- iperf3 from each worker to the master, one at a time (in parallel they would
  share the master's link and each look slower), with several parallel streams
  (-P): NCCL and gloo spread a collective over several sockets, and one TCP
  stream alone often cannot fill a fast link;
- the interface variables per node from what the probe found.
"""

from __future__ import annotations

import json
import random
import threading
import time

from qwen_tui.cluster.facts import ClusterFacts, LinkFacts
from qwen_tui.nodes.checks.findings import ERROR, INFO, WARNING, Finding
from qwen_tui.nodes.programs import program
from qwen_tui.nodes.results import on_nodes
from qwen_tui.nodes.transport.protocol import CommandResult, Transport
from qwen_tui.preset.schema import Preset

WARN_BELOW_GBPS = 10.0
IPERF_PORT = 5201
IPERF_STREAMS = 4  # NCCL's socket transport opens several connections per peer (NCCL_NSOCKS_PERTHREAD x threads)

# The listener prints {"bound": ...} and READY once bound, {"bound", "peers"} at the end; the connector
# prints {"host:port": null | error} (each file's header says more).
LISTEN = program("port_listen.py")
CONNECT = program("port_connect.py")

# One probe's bound: a connect on a LAN answers in milliseconds; a dropped SYN never does.
PROBE_S = 2.0


def node_address(preset: Preset, facts: ClusterFacts, i: int) -> str | None:
    """The address other nodes use for node i: master_addr for the master, else the
    address on the interface that routes to the master."""
    if i == 0:
        return preset.master_addr
    nf = facts.nodes.get(i)
    if nf and nf.route_interface and nf.addresses.get(nf.route_interface):
        return nf.addresses[nf.route_interface][0]
    return None


def sample_ports(rng_range: tuple[int, int] | None, k: int, avoid: set[int], rng: random.Random) -> list[int]:
    lo, hi = rng_range or (32768, 60999)  # Linux default ephemeral range
    out: list[int] = []
    while len(out) < k:
        p = rng.randint(lo, hi)
        if p not in avoid and p not in out:
            out.append(p)
    return out


def check_ports(preset: Preset, transports: dict[int, Transport], facts: ClusterFacts, *,
                window: float | None = None, sample: int = 2, seed: int | None = None,
                ephemeral: dict[int, tuple[int, int]] | None = None) -> list[Finding]:
    """Fill facts.master_port_free and facts.links[i].port_*; return findings."""
    nodes = preset.cluster.nodes
    port = preset.network.master_port
    window = window or max(3.0, min(preset.cluster.connect_timeout, 10.0))
    rng = random.Random(seed)
    idx = sorted(transports)
    findings: list[Finding] = []
    listen_ports = {i: ([port] if i == 0 else []) + sample_ports((ephemeral or {}).get(i), sample, {port, IPERF_PORT}, rng)
                    for i in idx}
    addrs = {i: node_address(preset, facts, i) for i in idx}
    targets = {i: [(addrs[j], p) for j in idx if j != i and addrs[j] for p in listen_ports[j]] for i in idx}
    # each probe has its own bound; the window gives every target its turn even when all
    # of them time out (capped: a target left without time is reported as not tried)
    window = max(window, min(60.0, PROBE_S * max((len(t) for t in targets.values()), default=1)))
    listeners: dict[int, object] = {}
    ready = {i: threading.Event() for i in idx}
    stop = threading.Event()
    start_bound = preset.cluster.connect_timeout + 10.0

    def listen(i: int) -> None:
        argv = [nodes[i].python, "-c", LISTEN,
                json.dumps({"ports": listen_ports[i], "window": window + start_bound, "expect": len(idx) - 1})]
        t = transports[i]
        lines: list[str] = []
        try:
            for ln in t.stream_lines(argv, stop=stop, timeout_first_line=start_bound):
                lines.append(ln)
                if ln.strip() == "READY":
                    ready[i].set()
        except Exception as e:  # the stream's own error is the finding: carried in the result
            listeners[i] = CommandResult(1, "\n".join(lines), f"{type(e).__name__}: {e}")
            return
        finally:
            ready[i].set()  # nobody waits on a listener that is gone
        got = [ln for ln in lines if ln.lstrip().startswith('{"bound"')]
        listeners[i] = CommandResult(0, got[-1], "") if got else CommandResult(1, "", "\n".join(lines[-5:]))

    threads = [threading.Thread(target=listen, args=(i,), daemon=True) for i in idx]
    for th in threads:
        th.start()
    # connectors start once every listener is bound: a late listener would read as a closed port
    deadline = time.monotonic() + start_bound
    for i in idx:
        ready[i].wait(timeout=max(0.0, deadline - time.monotonic()))

    def connect(i: int) -> dict:
        r = transports[i].run([nodes[i].python, "-c", CONNECT,
                               json.dumps({"targets": targets[i], "window": window, "probe": PROBE_S})],
                              timeout=window + 15)
        if not r.ok:
            raise RuntimeError(f"connect test failed (rc {r.rc}): {r.stderr.strip()[-300:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    conns = on_nodes(connect, idx, timeout=window + 25)
    stop.set()  # the connectors are done: a listener still waiting for a peer that never came ends now
    for th in threads:
        th.join(timeout=start_bound + 5)

    # master port free on the master?
    lr = listeners.get(0)
    bound: dict = {}
    if lr is not None and getattr(lr, "ok", False):
        try:
            bound = json.loads(lr.stdout.strip().splitlines()[-1])["bound"]
        except (json.JSONDecodeError, IndexError, KeyError):
            bound = {}
    if lr is None or not getattr(lr, "ok", False):
        facts.master_port_free = None
        findings.append(Finding(ERROR, "PORT_TEST_FAILED", f"could not run the port listener on the master: "
                                f"{getattr(lr, 'stderr', 'no answer')!s:.300}", "", 0, "port"))
    else:
        err = bound.get(str(port))
        facts.master_port_free = err is None
        if err is not None:
            findings.append(Finding(ERROR, "MASTER_PORT_IN_USE",
                                    f"port {port} on the master ({nodes[0].label}) cannot be bound: {err}",
                                    "pick another network.master_port, or stop what listens there "
                                    f"(ss -ltnp 'sport = :{port}')", 0, "port"))
    for i in idx:
        lk = facts.links.setdefault(i, LinkFacts())
        res = conns.get(i)
        if isinstance(res, BaseException):
            lk.port_reachable, lk.port_error = None, str(res)
            findings.append(Finding(ERROR, "PORT_TEST_FAILED", f"{nodes[i].label}: port test did not run: {res}",
                                    "", i, "port"))
            continue
        if i != 0 and facts.master_port_free:
            key = f"{addrs[0]}:{port}"
            err = res.get(key)
            if key not in res:  # the window ran out before it: unknown, not unreachable
                lk.port_reachable, lk.port_error = None, "not tried within the window"
            else:
                lk.port_reachable, lk.port_error = err is None, err
            if key in res and err is not None:
                findings.append(Finding(
                    ERROR, "MASTER_PORT_UNREACHABLE",
                    f"{nodes[i].label} cannot reach the master port {addrs[0]}:{port}: {err}",
                    f"open TCP port {port} from {nodes[i].label} to {nodes[0].label} (firewall), "
                    f"or pick a network.master_port that is open", i, "port"))
        bad, untried = [], []
        for j in idx:
            if j == i or not addrs[j]:
                continue
            for p in listen_ports[j]:
                if j == 0 and p == port:
                    continue
                if listeners.get(j) is not None and getattr(listeners[j], "ok", False):
                    try:
                        if json.loads(listeners[j].stdout.strip().splitlines()[-1])["bound"].get(str(p)):
                            continue  # that port was busy on the listener: not a network finding
                    except (json.JSONDecodeError, IndexError, KeyError):
                        pass  # no readable listener report: the connect result alone decides
                key = f"{addrs[j]}:{p}"
                if key not in res:
                    untried.append(f"{nodes[j].label}:{p}")
                elif res[key] is not None:
                    bad.append(f"{nodes[j].label}:{p} ({res[key]})")
        if bad:
            findings.append(Finding(ERROR, "HIGH_PORTS_BLOCKED",
                                    f"{nodes[i].label} cannot reach ephemeral ports that NCCL/gloo use: "
                                    + ", ".join(bad),
                                    "allow TCP between the nodes on the ephemeral range "
                                    "(/proc/sys/net/ipv4/ip_local_port_range)", i, "nccl-ports"))
        if untried:
            findings.append(Finding(INFO, "PORTS_NOT_TRIED", f"{nodes[i].label}: no time left to try "
                                    + ", ".join(untried) + f" (each probe waits up to {PROBE_S:g}s)",
                                    "fix the ports named above, then check again", i, "nccl-ports"))
    return findings


# ------------------------------------------------------------ firewall

def _iptables_rules(text: str, tool: str) -> list[str]:
    out = []
    for ln in text.splitlines():
        ln = ln.strip()
        if ln.startswith("-P ") and ln.split()[-1] in ("DROP", "REJECT"):
            out.append(f"{tool}: {ln}")
        elif ln.startswith("-A ") and (" -j DROP" in ln or " -j REJECT" in ln):
            out.append(f"{tool}: {ln}")
    return out


def _nft_rules(text: str) -> list[str]:
    out, table = [], ""
    for ln in text.splitlines():
        s = ln.strip()
        if s.startswith("table "):
            table = s.rstrip(" {")
        # iptables-nft keeps its rules in ip/ip6 tables named like iptables' own: shown above already
        if table.split()[1:2] in (["ip"], ["ip6"]) and table.split()[-1] in ("filter", "nat", "mangle", "raw", "security"):
            continue
        if (" drop" in f" {s}" or " reject" in f" {s}") and not s.startswith(("table", "chain")):
            out.append(f"nft ({table}): {s}")
    return out


# A login user's PATH (sshd's default for a non-root user) lacks the sbin directories
# where the firewall tools live: look there too.
SBIN_DIRS = ("/usr/sbin", "/sbin")


def _last_line(r) -> str:
    return (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or [f"rc {r.rc}"])[-1]


def _run_tool(t: Transport, tool: str, args: list[str]):
    """Run a firewall tool found on PATH or in an sbin directory; when it is there but
    refuses (not root), once more through `sudo -n` (never asks for a password).
    None when the tool is not installed."""
    for cand in (tool, *(f"{d}/{tool}" for d in SBIN_DIRS)):
        r = t.run([cand, *args], timeout=10)
        if r.rc == 127:
            continue
        if r.ok:
            return r
        s = t.run(["sudo", "-n", cand, *args], timeout=10)
        return s if s.ok else r
    return None


def read_firewall(t: Transport) -> tuple[list[str], list[str], str | None]:
    """(rules that drop or reject, notes about what could not be read, why the firewall
    could not be read at all: None once iptables or nft answered)."""
    rules, notes, read = [], [], False
    for tool in ("iptables", "ip6tables"):
        r = _run_tool(t, tool, ["-S"])
        if r is None:
            notes.append(f"{tool} not found (PATH, {', '.join(SBIN_DIRS)})")
        elif r.ok:
            rules += _iptables_rules(r.stdout, tool)
            read = read or tool == "iptables"
        else:
            notes.append(f"{tool} not readable: {_last_line(r)}")
    r = _run_tool(t, "nft", ["list", "ruleset"])
    if r is None:
        notes.append(f"nft not found (PATH, {', '.join(SBIN_DIRS)})")
    elif r.ok:
        rules += _nft_rules(r.stdout)
        read = True
    else:
        notes.append(f"nft not readable: {_last_line(r)}")
    r = _run_tool(t, "ufw", ["status"])
    if r is not None and r.ok and "Status: active" in r.stdout:
        rules += [f"ufw: {ln.strip()}" for ln in r.stdout.splitlines() if "DENY" in ln or "REJECT" in ln]
        if "Default: deny (incoming)" in r.stdout:
            rules.append("ufw: default deny (incoming)")
    unread = None if read else "; ".join(n for n in notes if not n.startswith("ip6tables")) or "no tool answered"
    return rules, notes, unread


def check_firewalls(preset: Preset, transports: dict[int, Transport], facts: ClusterFacts) -> list[Finding]:
    """Findings per node; a node whose rules could not be read gets LinkFacts.firewall_unread
    (the reason) and a warning: its firewall is "not checked", never "ok"."""
    res = on_nodes(lambda i: read_firewall(transports[i]), sorted(transports), timeout=90)
    findings = []
    fix = ("run the check as root, or let the login user read the rules without a password "
           "(sudoers: USER ALL=(root) NOPASSWD: /usr/sbin/iptables -S, /usr/sbin/nft list ruleset)")
    for i, v in sorted(res.items()):
        label = preset.cluster.nodes[i].label
        lk = facts.links.setdefault(i, LinkFacts())
        if isinstance(v, BaseException):
            lk.firewall, lk.firewall_unread = [], str(v)
            findings.append(Finding(WARNING, "FIREWALL_UNREAD", f"{label}: firewall not read: {v}", "", i, "firewall"))
            continue
        rules, notes, unread = v
        lk.firewall, lk.firewall_unread = rules, unread
        if rules:
            findings.append(Finding(WARNING, "FIREWALL_RULES", f"{label}: {len(rules)} rule(s) that drop or reject: "
                                    + "; ".join(rules[:5]), "make sure they spare the master port and the "
                                    "ephemeral range between the nodes", i, "firewall"))
        if unread:
            findings.append(Finding(WARNING, "FIREWALL_UNREAD", f"{label}: firewall not checked: {unread}",
                                    fix, i, "firewall"))
    return findings


# ------------------------------------------------------------ iperf3

def iperf_pair(server: Transport, client: Transport, server_addr: str, *, seconds: float = 2.0,
               port: int = IPERF_PORT, streams: int = IPERF_STREAMS) -> float:
    """Gbit/s from client to server over `streams` parallel TCP streams (their sum), measured by the iperf3
    program on both nodes."""
    box: dict = {}

    def serve() -> None:
        box["r"] = server.run(["iperf3", "-s", "-1", "-p", str(port)], timeout=seconds + 20)

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    deadline = time.monotonic() + 8
    while True:
        r = client.run(["iperf3", "-c", server_addr, "-p", str(port), "-t", f"{seconds:g}", "-P", str(streams),
                        "-J", "--connect-timeout", "3000"], timeout=seconds + 15)
        data = {}
        try:
            data = json.loads(r.stdout) if r.stdout.strip() else {}
        except json.JSONDecodeError:
            pass  # not iperf3's JSON: its exit code and stderr below say what went wrong
        err = data.get("error") or ("" if r.ok else (r.stderr.strip() or f"rc {r.rc}"))
        if not err:
            break
        if "refused" in err and time.monotonic() < deadline and th.is_alive():
            time.sleep(0.3)  # the server is not listening yet
            continue
        th.join(timeout=2)
        srv = box.get("r")
        if srv is not None and srv.rc == 127:
            raise RuntimeError(f"iperf3 missing on the master ({server.label})")
        if r.rc == 127:
            raise RuntimeError(f"iperf3 missing on {client.label}")
        raise RuntimeError(f"iperf3 {client.label} -> {server.label}: {err}")
    th.join(timeout=seconds + 20)
    ran = data.get("start", {}).get("test_start", {}).get("num_streams")
    if ran != streams:
        raise RuntimeError(f"iperf3 {client.label} -> {server.label}: ran {ran} stream(s), asked for {streams}")
    return data["end"]["sum_received"]["bits_per_second"] / 1e9


def check_bandwidth(preset: Preset, transports: dict[int, Transport], facts: ClusterFacts, *,
                    seconds: float = 2.0, warn_below_gbps: float = WARN_BELOW_GBPS,
                    streams: int = IPERF_STREAMS) -> list[Finding]:
    nodes = preset.cluster.nodes
    findings = []
    fix_install = "apt-get install iperf3 (or dnf install iperf3)"
    for i in sorted(transports):
        if i == 0:
            continue
        lk = facts.links.setdefault(i, LinkFacts())
        missing = [j for j in (0, i) if "iperf3" in (facts.nodes.get(j).missing_tools if facts.nodes.get(j) else [])]
        if missing:
            lk.bandwidth_error = "iperf3 missing on " + ", ".join(nodes[j].label for j in missing)
            findings.append(Finding(WARNING, "IPERF3_MISSING", f"{nodes[i].label}: bandwidth not measured: "
                                    f"{lk.bandwidth_error}", fix_install, i, "bandwidth"))
            continue
        try:
            g = iperf_pair(transports[0], transports[i], preset.master_addr, seconds=seconds, streams=streams)
        except Exception as e:  # per node: recorded in the facts and shown in the matrix
            lk.bandwidth_error = str(e)
            findings.append(Finding(WARNING, "BANDWIDTH_UNMEASURED", f"{nodes[i].label}: {e}",
                                    fix_install if "missing" in str(e) else "", i, "bandwidth"))
            continue
        lk.bandwidth_gbps = round(g, 3)
        if g < warn_below_gbps:
            findings.append(Finding(WARNING, "LOW_BANDWIDTH",
                                    f"{nodes[i].label} -> master: {g:.2f} Gbit/s over {streams} streams (under "
                                    f"{warn_below_gbps:g}); "
                                    "gradient all-reduce will be slow over this link",
                                    "use a faster interface (network.interface) or fewer nodes", i, "bandwidth"))
        else:
            findings.append(Finding(INFO, "BANDWIDTH", f"{nodes[i].label} -> master: {g:.2f} Gbit/s over {streams} "
                                    "streams", "", i, "bandwidth"))
    return findings


# ------------------------------------------------------------ interface variables
