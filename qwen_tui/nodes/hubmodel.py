"""Hub models downloaded once: the master fetches a hub id, the sync copies it to the other nodes.

Without this every node resolved `Qwen/Qwen2.5-72B-Instruct` on its own: N downloads of 145 GB, and nodes
that cannot reach the hub failed at load. Now (`qwen-tui check --sync`):
- the master runs huggingface_hub's snapshot_download (its hub cache; HF_HUB_OFFLINE, HF_ENDPOINT, HF_HOME
  and HF_HUB_CACHE honoured, from the master's environment and the preset's network.env) and lays the
  snapshot out in its workdir as `.qwen-tui/models/ORG--NAME` (hard links into the hub cache where the
  filesystem allows, so no second copy; staged in `.partial` and renamed when complete);
- the checksum-verified sync copies that directory to the nodes that lack it, at the same place in
  their workdir;
- the worker, given a hub id, loads `.qwen-tui/models/ORG--NAME` from its workdir when it is there
  (training.model.resolve_model_source).
A token (HF_TOKEN) reaches the master's download through stdin, never argv.
"""

from __future__ import annotations

import json
import os
import posixpath
import re

from qwen_tui.nodes.programs import program

SYNCED_DIR = ".qwen-tui/models"
SYNCED_DATASETS = ".qwen-tui/datasets"  # training.data.sources reads hf:ORG/NAME there
HF_PASSED = ("HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_ENABLE_HF_TRANSFER")
_HUB_ID = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


def hub_id(spec: str) -> bool:
    """ORG/NAME as the hub spells it (a path starts with /, . or ~; builtin: is ours)."""
    return not spec.startswith(("builtin:", "/", ".", "~")) and _HUB_ID.fullmatch(spec) is not None


def synced_rel(repo_id: str) -> str:
    """Where the synced copy lives, relative to a node's workdir (training.model reads the same place)."""
    return posixpath.join(SYNCED_DIR, repo_id.replace("/", "--"))


def synced_dataset_rel(repo_id: str) -> str:
    """Where a synced hub data set lives, relative to a node's workdir (training.data.sources reads the same place)."""
    return posixpath.join(SYNCED_DATASETS, repo_id.replace("/", "--"))


def hub_datasets(preset) -> list[str]:
    """The hub data sets (hf:ORG/NAME) the preset's data, eval data and mixture name, in order, once each."""
    t = preset.training
    specs = [t.data, t.eval_data] + [s.path for s in (t.datasets or [])]
    out: list[str] = []
    for s in specs:
        if s and s.startswith("hf:") and hub_id(s[3:]) and s[3:] not in out:
            out.append(s[3:])
    return out


# Downloads the model or a data set on the master into DEST in the workdir (remote/hub_download.py says how).
DOWNLOAD = program("hub_download.py")


def hf_env(network_env: dict, own_env: dict | None = None) -> tuple[dict, str | None]:
    """(environment for the master's download, token): qwen-tui's own HF_* settings, the preset's winning."""
    own = os.environ if own_env is None else own_env
    env = {k: own[k] for k in HF_PASSED if own.get(k)}
    env.update({k: v for k, v in network_env.items() if k in HF_PASSED})
    token = network_env.get("HF_TOKEN") or own.get("HF_TOKEN") or own.get("HUGGING_FACE_HUB_TOKEN")
    return env, token


def download_on_master(preset, transport, *, python: str, timeout: float = 7200.0,
                       dataset: str | None = None) -> tuple[str, str, str]:
    """Fetches the preset's hub model (or the hub data set `dataset`) on node 0. Returns (action, path, detail):
    action is 'downloaded', 'already there' or 'failed'."""
    repo = dataset or preset.training.model
    master = preset.cluster.nodes[0]
    dest = synced_dataset_rel(repo) if dataset else synced_rel(repo)
    env, token = hf_env(preset.network.env)
    r = transport.run([python, "-c", DOWNLOAD, repo, dest, "dataset" if dataset else "model"], timeout=timeout,
                      env=env, cwd=master.workdir, input=(token or "").encode())
    if r.rc != 0:
        why = (r.stderr.strip() or r.stdout.strip())[-400:] or f"exit {r.rc}"
        return "failed", dest, f"{repo} on node 0: {why}"
    try:
        res = json.loads(r.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return "failed", dest, f"{repo} on node 0: no result printed: {r.stdout[-200:]!r}"
    if res.get("already"):
        return "already there", res["path"], ""
    return "downloaded", res["path"], (f"{repo} from {res['source']} ({res['linked']} files linked, "
                                       f"{res['copied']} copied)")
