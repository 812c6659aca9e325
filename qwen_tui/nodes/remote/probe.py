# The node probe (qwen_tui.nodes.probe): python3 -c PROGRAM ARGS_JSON, run by the node's own Python in the
# node's workdir. Prints one JSON object (the last line) that becomes NodeFacts: host, Python, addresses and
# the route to the master, tools, nvidia-smi's raw answers, InfiniBand ports, versions, disk, limits, and the
# data files' and model's digests. Comes after ib_sysfs.py and digests.py (read_sysfs, sha_file).

import hashlib, json, os, platform, shutil, socket, subprocess, sys
a = json.loads(sys.argv[1])
out = {"hostname": socket.gethostname(), "python_version": platform.python_version(),
       "python": sys.executable, "cpu_count": os.cpu_count(), "cwd": os.getcwd()}
# in a container? podman's and docker's marker files, Apptainer's and enroot's variables
out["in_container"] = next((p for p in ("/run/.containerenv", "/.dockerenv") if os.path.exists(p)), None) or \
    next((v for v in ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "ENROOT_ROOTFS") if os.environ.get(v)), None)
def run(argv, t=20):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=t)
        return {"rc": p.returncode, "out": p.stdout, "err": p.stderr[-2000:]}
    except FileNotFoundError:
        return {"rc": 127, "out": "", "err": argv[0] + ": not found"}
    except subprocess.TimeoutExpired:
        return {"rc": 124, "out": "", "err": argv[0] + ": timed out"}
try:
    out["memory_total_mib"] = int(open("/proc/meminfo").read().split()[1]) // 1024
except (OSError, ValueError, IndexError):
    out["memory_total_mib"] = None
addrs = {}
r = run(["ip", "-j", "-4", "addr"])
if r["rc"] == 0:
    for itf in json.loads(r["out"] or "[]"):
        addrs[itf["ifname"]] = [x["local"] for x in itf.get("addr_info", []) if x.get("family") == "inet"]
out["addresses"] = addrs
try:  # the interface the kernel would use to reach the master (no packet is sent)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect((a["master"], 9))
    mine = s.getsockname()[0]; s.close()
    out["route_src"] = mine
    out["route_interface"] = next((i for i, v in addrs.items() if mine in v), None)
except OSError as e:
    out["route_interface"] = None; out["route_error"] = str(e)
tools = {}
bindir = os.path.dirname(sys.executable)
for t in a["tools"]:
    p = shutil.which(t) or (os.path.join(bindir, t) if os.path.exists(os.path.join(bindir, t)) else None)
    tools[t] = p
out["tools"] = tools
if tools.get("nvidia-smi"):
    out["nvidia_smi"] = run(a["gpu_query"]); out["nvidia_smi_version"] = run(["nvidia-smi", "--version"])
    if out["nvidia_smi"]["rc"] == 0:  # how the GPUs reach each other, and whether the driver allows P2P
        out["topo"] = run(["nvidia-smi", "topo", "-m"], 15)
        if out["topo"]["rc"] == 0 and "GPU1" in out["topo"]["out"]:
            out["p2p"] = {c: run(["nvidia-smi", "topo", "-p2p", c], 15) for c in ("r", "w")}
ib = "/sys/class/infiniband"
out["ib_devices"] = sorted(os.listdir(ib)) if os.path.isdir(ib) else []
out["ib_ports"] = read_sysfs(ib)
if shutil.which("ibv_devinfo"):  # the verbs library's view, where the tool is installed
    out["ibv_devinfo"] = run(["ibv_devinfo", "-v"])
try:
    out["ephemeral_ports"] = [int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split()]
except (OSError, ValueError):
    out["ephemeral_ports"] = None
from importlib import metadata
vers = {}
for m in a["versioned"]:
    try:
        vers[m] = metadata.version(m)
    except metadata.PackageNotFoundError:
        vers[m] = None
out["versions"] = vers
if vers.get("torch"):
    try:
        import torch
        out["cuda_version"] = torch.version.cuda
        out["torch_cuda_available"] = bool(torch.cuda.is_available())
    except Exception as e:  # reported: a torch that does not import is a finding
        out["torch_error"] = f"{type(e).__name__}: {e}"
sys.path.insert(0, os.getcwd())
try:
    import importlib.util
    import training
    out["training_importable"] = importlib.util.find_spec("training.finetune") is not None
    if not out["training_importable"]:
        out["training_error"] = "training.finetune not found in " + os.getcwd()
except Exception as e:
    out["training_importable"] = False; out["training_error"] = f"{type(e).__name__}: {e}"
def free(p):
    p = os.path.abspath(os.path.expanduser(p))
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return shutil.disk_usage(p).free
out["disk_free_bytes"] = free(a["output_dir"])
try:  # NCCL's shared-memory transport and DataLoader workers live in /dev/shm
    v = os.statvfs("/dev/shm"); out["shm_bytes"] = v.f_blocks * v.f_frsize
except OSError:
    out["shm_bytes"] = None
import resource
def soft(lim):  # -1: unlimited
    x = resource.getrlimit(lim)[0]
    return -1 if x == resource.RLIM_INFINITY else x
out["memlock_bytes"] = soft(resource.RLIMIT_MEMLOCK); out["open_files"] = soft(resource.RLIMIT_NOFILE)
def fact(p):
    if p is None:
        return None
    q = os.path.abspath(os.path.expanduser(p))
    if os.path.isfile(q):
        return {"path": q, "exists": True, "size_bytes": os.path.getsize(q), "sha256": sha_file(q)}
    if os.path.isdir(q):
        items = []
        for root, dirs, files in os.walk(q):
            dirs.sort()
            for n in sorted(files):
                f = os.path.join(root, n)
                items.append([os.path.relpath(f, q), os.path.getsize(f), sha_file(f)])
        h = hashlib.sha256(json.dumps(items).encode()).hexdigest()
        return {"path": q, "exists": True, "size_bytes": sum(i[1] for i in items), "sha256": h}
    return {"path": q, "exists": False}
out["data"] = fact(a["data"]); out["model"] = fact(a["model"])
out["data_files"] = files = {k: fact(p) for k, p in (a.get("data_files") or {}).items()}
for k, name in (a.get("dataset_entries") or {}).items():
    # a dataset_info.json entry's own file, beside the json, as LLaMA-Factory (and the worker) read it
    info = files.get(k)
    if not info or not info["exists"] or not os.path.isfile(info["path"]):
        continue
    try:
        with open(info["path"]) as fh:
            entry = json.load(fh).get(name)
    except (OSError, ValueError, AttributeError):
        continue  # the worker names an unreadable file itself
    if isinstance(entry, dict) and isinstance(entry.get("file_name"), str):
        files[k.rsplit(".", 1)[0] + ".file_name"] = fact(os.path.join(os.path.dirname(info["path"]),
                                                                       entry["file_name"]))
if a.get("hub_model") and out["model"] is None:
    # a hub id: the copy qwen-tui synced into the workdir, else the node's hub cache (the snapshot refs/main names)
    synced, repo = a["hub_model"]
    if os.path.isfile(os.path.join(synced, "config.json")):
        out["model"] = fact(synced)
    else:
        env = dict(os.environ, **a.get("hf_env", {}))  # the run's own settings (network.env) first
        hub = env.get("HF_HUB_CACHE") or os.path.join(env.get("HF_HOME") or os.path.join(
            os.path.expanduser("~"), ".cache", "huggingface"), "hub")
        d = os.path.join(hub, "models--" + repo.replace("/", "--"))
        try:
            rev = open(os.path.join(d, "refs", "main")).read().strip()
        except OSError:
            rev = None
        snap = os.path.join(d, "snapshots", rev) if rev else None
        if snap and os.path.isfile(os.path.join(snap, "config.json")):
            out["model"] = fact(snap)
out["digest_cache"] = save_digests()
print(json.dumps(out))
