# A node's command server for transports that have no SSH channel to open (qwen_tui.nodes.slurm: one
# `srun --overlap` step per node runs it for as long as qwen-tui follows the job, so that every check and every
# read of a running job is one line on a pipe instead of a new job step each).
# python3 -u -c PROGRAM: reads one JSON request a line on stdin, answers one JSON line each on stdout, several at
# once (each request in a thread of its own; answers carry the request's id):
#   {"id", "op": "hello"} -> {"id", "pid", "home", "host"}
#   {"id", "op": "run", "argv", "env", "cwd", "input" (base64), "timeout"} -> {"id", "rc", "out", "err"} (base64)
#   {"id", "op": "read", "path", "offset", "limit"} -> {"id", "data"} (base64), {"id", "missing": true}
#   {"id", "op": "put", "path", "data", "first", "last", "mode"} -> {"id", "ok": true} (a temp file, renamed last)
#   {"id", "op": "stream", "argv"} -> {"id", "line"}... then {"id", "end": rc}; {"op": "cancel", "target": id} ends it
# Errors answer {"id", "error": text}. Every command runs in a session of its own, killed with its group when
# its bound passes, when a stream is cancelled, or when stdin closes (qwen-tui went away): nothing it started
# outlives it. Standard library only.
import base64, json, os, signal, socket, subprocess, sys, threading

_out = threading.Lock()
_procs = {}  # request id -> Popen of a command under way
_lock = threading.Lock()


def say(msg):
    line = json.dumps(msg, separators=(",", ":")) + "\n"
    with _out:
        sys.stdout.write(line)
        sys.stdout.flush()


def b64(data):
    return base64.b64encode(data).decode()


def end_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def popen(req, **kw):
    env = None
    if req.get("env"):
        env = dict(os.environ)
        env.update(req["env"])
    return subprocess.Popen(req["argv"], cwd=req.get("cwd") or None, env=env, start_new_session=True, **kw)


def do_run(req):
    try:
        p = popen(req, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError as e:
        return {"rc": 127, "out": "", "err": b64(f"{req['argv'][0]}: command not found ({e.strerror})".encode())}
    except OSError as e:
        return {"rc": 126, "out": "", "err": b64(f"{req['argv'][0]}: {e}".encode())}
    with _lock:
        _procs[req["id"]] = p
    try:
        data = base64.b64decode(req["input"]) if req.get("input") else None
        try:
            out, err = p.communicate(data, timeout=float(req.get("timeout") or 30))
            rc = p.returncode
        except subprocess.TimeoutExpired:
            end_group(p)
            out, err = p.communicate()
            rc, err = 124, err + f"\ntimed out after {req.get('timeout')}s".encode()
    finally:
        with _lock:
            _procs.pop(req["id"], None)
    return {"rc": rc, "out": b64(out), "err": b64(err)}


def do_read(req):
    try:
        with open(req["path"], "rb") as f:
            f.seek(int(req.get("offset") or 0))
            return {"data": b64(f.read(int(req.get("limit") or 1 << 20)))}
    except FileNotFoundError:
        return {"missing": True}


_puts = {}  # path -> temp path being written


def do_put(req):
    path = req["path"]
    if req.get("first"):
        parent = os.path.dirname(path) or "."
        os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.{os.urandom(4).hex()}.part"
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # a planted link is never followed
        _puts[path] = tmp
    tmp = _puts[path]
    with open(tmp, "ab") as f:
        f.write(base64.b64decode(req.get("data") or ""))
    if req.get("last"):
        os.chmod(tmp, int(req.get("mode") or 0o644))
        os.replace(tmp, path)
        del _puts[path]
    return {"ok": True}


def do_stream(req):
    try:
        p = popen(req, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError:
        return {"end": 127}
    with _lock:
        _procs[req["id"]] = p
    try:
        for raw in p.stdout:
            say({"id": req["id"], "line": raw.rstrip(b"\r\n").decode(errors="replace")})
        return {"end": p.wait()}
    finally:
        end_group(p)
        with _lock:
            _procs.pop(req["id"], None)


def do_hello(req):
    return {"pid": os.getpid(), "home": os.path.expanduser("~"), "host": socket.gethostname()}


OPS = {"hello": do_hello, "run": do_run, "read": do_read, "put": do_put, "stream": do_stream}


def serve(req):
    try:
        ans = OPS[req["op"]](req)
    except Exception as e:  # answered, never swallowed: the caller raises it as the node's error
        ans = {"error": f"{type(e).__name__}: {e}"}
    ans["id"] = req["id"]
    say(ans)


def main():
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue  # not a request: the caller only sends whole lines
        if req.get("op") == "cancel":
            with _lock:
                p = _procs.get(req.get("target"))
            if p is not None:
                end_group(p)
            continue
        if req.get("op") == "put":
            serve(req)  # in order: a file's chunks must land one after the other
            continue
        threading.Thread(target=serve, args=(req,), daemon=True).start()
    with _lock:
        left = list(_procs.values())
    for p in left:
        end_group(p)


main()
