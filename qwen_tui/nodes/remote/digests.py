# SHA-256 of files, cached on the node: part of the probe and the manifest, which call sha_file(path) and,
# at the end, save_digests().
#
# A model of 145 GB takes minutes to hash; every `check` used to hash it again. sha_file hashes a file once
# and keeps its SHA-256 in the node's cache ($QWEN_TUI_CACHE, else $XDG_CACHE_HOME/qwen-tui or
# ~/.cache/qwen-tui, digests.json), keyed by the file's real path and reused while its size, mtime and inode
# are unchanged (a rewritten file gets a new mtime or inode, so it is hashed again). save_digests() writes the
# cache back atomically when it changed and reports what was computed and reused; a cache that cannot be
# written costs only time, and is reported.

import hashlib as _hl, json as _js, os as _os
_XDG = _os.environ.get("XDG_CACHE_HOME") or ""
_DIG_PATH = _os.path.join(_os.environ.get("QWEN_TUI_CACHE") or (_os.path.join(_XDG, "qwen-tui") if _os.path.isabs(_XDG)
                          else _os.path.join(_os.path.expanduser("~"), ".cache", "qwen-tui")), "digests.json")
try:
    with open(_DIG_PATH) as _f:
        _DIG = _js.load(_f)
    if not isinstance(_DIG, dict):
        _DIG = {}
except (OSError, ValueError):
    _DIG = {}
_DIG_NEW = [0, 0]  # [digests computed, digests reused]
def sha_file(p):
    real = _os.path.realpath(p)
    st = _os.stat(real)
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    got = _DIG.get(real)
    if isinstance(got, list) and len(got) == 4 and got[:3] == stamp:
        _DIG_NEW[1] += 1
        return got[3]
    h = _hl.sha256()
    with open(real, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    _DIG[real] = stamp + [h.hexdigest()]
    _DIG_NEW[0] += 1
    return h.hexdigest()
def save_digests():
    """What the cache did, for the snippet's JSON: {"computed", "reused", "error"}."""
    rep = {"computed": _DIG_NEW[0], "reused": _DIG_NEW[1], "error": None}
    if not _DIG_NEW[0]:
        return rep
    try:
        _os.makedirs(_os.path.dirname(_DIG_PATH), exist_ok=True)
        live = {k: v for k, v in _DIG.items() if _os.path.exists(k)}  # forget files that are gone
        tmp = _DIG_PATH + ".%d.tmp" % _os.getpid()
        with open(tmp, "w") as f:
            _js.dump(live, f)
        _os.replace(tmp, _DIG_PATH)
    except OSError as e:  # a read-only home: the digests are right, only not kept for next time
        rep["error"] = "%s: %s" % (_DIG_PATH, e.strerror)
    return rep
