# A file's or directory's manifest (qwen_tui.nodes.sync): python3 -c PROGRAM PATH SKIP_DIRS_JSON.
# Prints path -> {"exists", "dir", "sha256", "size", "files": [[rel, size, sha256]]}: the same digest as the
# probe's (a file's sha256, or sha256 of the JSON file list). Comes after digests.py (sha_file).

import hashlib, json, os, sys
q = os.path.abspath(os.path.expanduser(sys.argv[1]))
skip = set(json.loads(sys.argv[2]))
sha = sha_file  # digests cached by size, mtime and inode (qwen_tui.nodes.digests)
if os.path.isfile(q):
    print(json.dumps({"path": q, "exists": True, "dir": False, "size": os.path.getsize(q), "sha256": sha(q)}))
elif os.path.isdir(q):
    items = []
    for root, dirs, files in os.walk(q):
        dirs[:] = sorted(d for d in dirs if d not in skip)
        for n in sorted(files):
            if n.endswith(".pyc"):
                continue
            f = os.path.join(root, n)
            items.append([os.path.relpath(f, q), os.path.getsize(f), sha(f)])
    print(json.dumps({"path": q, "exists": True, "dir": True, "size": sum(i[1] for i in items),
                      "sha256": hashlib.sha256(json.dumps(items).encode()).hexdigest(), "files": items}))
else:
    print(json.dumps({"path": q, "exists": False}))
save_digests()
