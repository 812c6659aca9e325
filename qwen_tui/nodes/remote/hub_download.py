# A hub model or data set downloaded on the master (qwen_tui.nodes.hubmodel): python3 -c PROGRAM REPO DEST [TYPE],
# the token on stdin; TYPE is model (the default) or dataset. huggingface_hub fetches it into the node's hub cache,
# then DEST (relative to the workdir) gets the files as hard links (copies across filesystems), through
# DEST.partial. Prints {"path", "already"} or {"path", "source", "linked", "copied"}; exit 3: no huggingface_hub,
# 4: the download failed (stderr says why).

import json, os, shutil, sys
repo, dest = sys.argv[1], os.path.abspath(sys.argv[2])
kind = sys.argv[3] if len(sys.argv) > 3 else "model"
if os.path.isfile(os.path.join(dest, "config.json")) or (kind == "dataset" and os.path.isdir(dest) and os.listdir(dest)):
    print(json.dumps({"path": dest, "already": True})); sys.exit(0)
if kind == "model" and os.path.isfile(os.path.join(repo, "config.json")):
    # a model folder in the workdir spelled like ORG/NAME: the worker loads it as it is (training.model.pretrained)
    print(json.dumps({"path": os.path.abspath(repo), "already": True, "local": True})); sys.exit(0)
try:
    from huggingface_hub import snapshot_download
except ImportError:
    print("huggingface_hub is not installed for " + sys.executable, file=sys.stderr); sys.exit(3)
token = sys.stdin.read().strip() or None
try:
    src = snapshot_download(repo, token=token, **({"repo_type": "dataset"} if kind == "dataset" else {}))
except Exception as e:
    print("%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""), file=sys.stderr); sys.exit(4)
part = dest + ".partial"
shutil.rmtree(part, ignore_errors=True)
linked = copied = 0
for root, dirs, files in os.walk(src):
    dirs.sort()
    for n in sorted(files):
        f = os.path.join(root, n)
        t = os.path.join(part, os.path.relpath(f, src))
        os.makedirs(os.path.dirname(t), exist_ok=True)
        try:
            os.link(os.path.realpath(f), t); linked += 1
        except OSError:
            shutil.copy2(os.path.realpath(f), t); copied += 1
os.makedirs(os.path.dirname(dest), exist_ok=True)
os.rename(part, dest)
print(json.dumps({"path": dest, "source": src, "linked": linked, "copied": copied}))
