# The listener of the port check (qwen_tui.nodes.netcheck): python3 -c PROGRAM '{"ports", "window", "expect"}'.
# Binds the given ports on all addresses, accepts until every port has heard from `expect` peers or the
# window ends. Once bound it prints {"bound": {port: null | error}} and READY (what a streamed listener needs:
# it is stopped when the connectors are done), at the end {"bound": ..., "peers": {port: [addr...]}}.

import json, select, socket, sys, time
a = json.loads(sys.argv[1]); end = time.monotonic() + a["window"]
socks, bound, peers = {}, {}, {}
for p in a["ports"]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # as torch's TCPStore does: a TIME_WAIT left by an earlier run does not make the port busy
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", p)); s.listen(64); socks[s] = p; bound[p] = None; peers[p] = []
    except OSError as e:
        bound[p] = e.strerror or str(e); s.close()
print(json.dumps({"bound": bound}), flush=True)
print("READY", flush=True)
while socks and time.monotonic() < end:
    if all(len(set(peers[p])) >= a["expect"] for p in socks.values()):
        break  # everyone got through: no need to sit out the window
    r, _, _ = select.select(list(socks), [], [], max(0.0, min(0.2, end - time.monotonic())))
    for s in r:
        c, addr = s.accept(); peers[socks[s]].append(addr[0])
        # let the client close first: TIME_WAIT then stays on its side, not on the job's port
        c.settimeout(2)
        try:
            c.recv(1)
        except OSError:
            pass  # the client hung up or timed out: either way it reached us
        c.close()
print(json.dumps({"bound": bound, "peers": peers}))
