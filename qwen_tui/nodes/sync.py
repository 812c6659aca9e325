"""Sync: copy the data files, the model directory or the project's training code
from the master (node 0) to the nodes where the probe found them missing, over
SFTP, then verify the checksum on the node. A file that exists but differs is
never overwritten without consent (`overwrite=True`).
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from qwen_tui.cluster.facts import ClusterFacts, file_fact
from qwen_tui.nodes.hubmodel import hub_datasets, hub_id, synced_dataset_rel, synced_rel
from qwen_tui.nodes.programs import program
from qwen_tui.nodes.results import NodeResults, on_nodes
from qwen_tui.nodes.transport.local import LocalTransport
from qwen_tui.nodes.transport.protocol import Transport, TransportError
from qwen_tui.preset.schema import Preset

# path -> {"exists", "dir", "sha256", "size", "files": [[rel, size, sha256]]}; the
# same digest as the probe's (a file's sha256, or sha256 of the JSON file list).
MANIFEST = program("manifest.py")  # remote/digests.py and manifest.py
SKIP_DIRS = ["__pycache__", ".git"]

Progress = Callable[[int, str, int, int], None]  # node, path, bytes done, bytes total


@dataclass
class SyncAction:
    node: int
    kind: str  # data | model | code | dataset ORG/NAME | a data_files field (eval_data, datasets.K.path, ...)
    path: str
    action: str  # copied | same | differs (left untouched) | missing on master | failed
    detail: str = ""


def manifest(t: Transport, python: str, path: str, *, timeout: float = 600.0) -> dict:
    r = t.run([python, "-c", MANIFEST, path, json.dumps(SKIP_DIRS)], timeout=timeout)
    if not r.ok:
        raise TransportError(f"{t.label}: cannot read {path}: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _copy_file(src: Transport, src_path: str, dst: Transport, dst_path: str, *,
               progress: Callable[[int, int], None] | None) -> None:
    """master file -> node file. A remote master's file passes through a local temp file."""
    if isinstance(src, LocalTransport):
        dst.put_file(src_path, dst_path, progress=progress)
        return
    with tempfile.TemporaryDirectory(prefix="qwen-tui-sync-") as d:
        tmp = os.path.join(d, "f")
        src.get_file(src_path, tmp)
        dst.put_file(tmp, dst_path, progress=progress)


def _targets(preset: Preset, facts: ClusterFacts) -> list[tuple[str, str, str]]:
    """(kind, master path, attr) for what the probe can compare."""
    m = facts.nodes.get(0)
    out = []
    for kind in ("data", "model", *(sorted(m.data_files) if m else ())):
        f = file_fact(m, kind)
        if f is not None:
            out.append((kind, f.path, kind))
    return out


def sync(preset: Preset, transports: dict[int, Transport], facts: ClusterFacts, *, overwrite: bool = False,
         code: bool = True, progress: Progress | None = None, timeout: float = 3600.0) -> NodeResults:
    """node -> [SyncAction]. Copies what is missing; what differs only with `overwrite`."""
    nodes = preset.cluster.nodes
    master = transports[0]
    plan: list[tuple[str, str]] = [(kind, path) for kind, path, _ in _targets(preset, facts)]
    for repo in hub_datasets(preset):  # downloaded on the master (check --sync), at the same place on every node
        plan.append((f"dataset {repo}", posixpath.join(nodes[0].workdir, synced_dataset_rel(repo))))
    if code:
        plan.append(("code", posixpath.join(nodes[0].workdir, "training")))
    src: dict[str, dict] = {}
    for kind, path in plan:
        src[kind] = manifest(master, nodes[0].python, path)

    def one(i: int) -> list[SyncAction]:
        t, py = transports[i], nodes[i].python
        acts: list[SyncAction] = []
        for kind, _ in plan:
            s = src[kind]
            if kind == "code":
                path = posixpath.join(nodes[i].workdir, "training")
            elif kind.startswith("dataset "):
                path = posixpath.join(nodes[i].workdir, synced_dataset_rel(kind.split(" ", 1)[1]))
            else:
                ff = file_fact(facts.nodes.get(i), kind)
                path = ff.path if ff is not None else s["path"]
                if kind == "model" and hub_id(preset.training.model):
                    if ff is not None and ff.exists and ff.sha256 == s["sha256"]:
                        acts.append(SyncAction(i, kind, ff.path, "same"))
                        continue
                    # into the workdir's synced copy, where the worker looks for a hub id first
                    path = posixpath.join(nodes[i].workdir, synced_rel(preset.training.model))
            if not s["exists"]:
                acts.append(SyncAction(i, kind, path, "missing on master", s["path"]))
                continue
            d = manifest(t, py, path)
            if d["exists"] and d["sha256"] == s["sha256"]:
                acts.append(SyncAction(i, kind, d["path"], "same"))
                continue
            if d["exists"] and not overwrite:
                acts.append(SyncAction(i, kind, d["path"], "differs (left untouched)",
                                       f"sha256 {d['sha256'][:12]} vs master {s['sha256'][:12]}; "
                                       "consent to replace it: --overwrite"))
                continue
            dest = d["path"]
            files = [("", s["size"])] if not s["dir"] else [(rel, size) for rel, size, _ in s["files"]]
            have = {rel: sh for rel, _, sh in d.get("files", [])} if d.get("dir") else {}
            want = {rel: sh for rel, _, sh in s.get("files", [])}
            for rel, _ in files:
                if s["dir"] and have.get(rel) == want[rel]:
                    continue
                sp = posixpath.join(s["path"], rel) if rel else s["path"]
                dp = posixpath.join(dest, rel) if rel else dest
                cb = (lambda done, total, _p=dp: progress(i, _p, done, total)) if progress else None
                _copy_file(master, sp, t, dp, progress=cb)
            after = manifest(t, py, dest)
            if after.get("sha256") != s["sha256"]:
                # files the master lacks are never deleted (they are not the master's to judge): name them
                extra = sorted({rel for rel, _, _ in after.get("files", [])} - set(want))
                why = (f"{len(extra)} file(s) on the node are not on the master: {', '.join(extra[:5])}"
                       f"{' ...' if len(extra) > 5 else ''}; remove them or the directory, then sync again"
                       if extra else "checksum differs after the copy")
                acts.append(SyncAction(i, kind, dest, "failed", why))
            else:
                acts.append(SyncAction(i, kind, dest, "copied", f"{s['size']} bytes, sha256 verified"))
        return acts

    labels = {i: n.label for i, n in enumerate(nodes)}
    return on_nodes(one, [i for i in sorted(transports) if i != 0], timeout=timeout, labels=labels)


def sync_from_master(preset: Preset, transports: dict[int, Transport], facts: ClusterFacts, *,
                     overwrite: bool = False) -> tuple[list[str], int]:
    """The checksum-verified copy `qwen-tui check --sync` runs, for the wizard's Network step: data, model and
    training code from the master to the nodes that lack them (or, with `overwrite`, whose copy differs). Nodes
    not probed yet are probed first. Returns one line per node and kind, and how many copies differ and were
    left."""
    from qwen_tui.nodes.checks.probe import probe_node

    facts = ClusterFacts(nodes=dict(facts.nodes))
    for i in sorted(transports):
        if i not in facts.nodes or facts.nodes[i].error:
            out = probe_node(transports[i], preset, i)
            facts.nodes[i] = out[0] if isinstance(out, tuple) else out  # (facts, raw JSON)
    res = sync(preset, transports, facts, overwrite=overwrite)
    lines, differ = [], 0
    for i, acts in sorted(res.items()):
        lab = preset.cluster.nodes[i].label
        if isinstance(acts, BaseException):
            lines.append(f"{lab}: {acts}")
            continue
        for a in acts:
            lines.append(f"{lab} {a.kind}: {a.action}" + (f" ({a.detail})" if a.detail else ""))
            differ += a.action.startswith("differs")
    return lines, differ
