# The connector of the port check (qwen_tui.nodes.netcheck): python3 -c PROGRAM '{"targets", "window", "probe"}'.
# Connects to each (host, port), each within its own bound (`probe` seconds), all within the window.
# "refused" is retried inside the probe's bound (a REJECT rule answers at once; a late listener too), a
# timeout is not. A target the window left no time for is left out: only what was tried is reported.
# Prints {"host:port": null | error}.

import json, socket, sys, time
a = json.loads(sys.argv[1]); end = time.monotonic() + a["window"]; res = {}
for host, port in a["targets"]:
    now = time.monotonic()
    if now >= end:
        break
    stop = min(end, now + a["probe"]); err = f"timed out after {a['probe']:g}s (packets dropped: a firewall?)"
    while True:
        left = stop - time.monotonic()
        if left <= 0:
            break
        try:
            socket.create_connection((host, port), timeout=left).close(); err = None; break
        except ConnectionRefusedError:
            err = "connection refused"; time.sleep(0.1)
        except socket.timeout:
            err = f"timed out after {a['probe']:g}s (packets dropped: a firewall?)"; break
        except OSError as e:
            err = e.strerror or str(e); time.sleep(0.1)
    res[f"{host}:{port}"] = err
print(json.dumps(res))
