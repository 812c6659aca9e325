"""Data sets in the containers they come in, and several of them mixed (`--datasets`).

A source is a path:
    FILE.json / FILE.jsonl     records as training.data.records reads them
    FILE.parquet / FILE.arrow  a table whose rows are records (pyarrow: `pip install pyarrow`)
    DIR                        a datasets.save_to_disk folder (its state.json names its Arrow files), or a folder of
                               such files (a hub snapshot: data/train-00000-of-00002.parquet ...), read in name order
    hf:ORG/NAME                a hub data set that `qwen-tui check --sync` downloaded on the master and copied to every
                               node into .qwen-tui/datasets/ORG--NAME (relative to the working directory)
in a format (training.data.formats; auto: from each record's keys), or an entry of LLaMA-Factory's
dataset_info.json, read as LLaMA-Factory reads it: its file_name (beside the json), formatting (alpaca or
sharegpt), ranking (preference pairs), columns and tags.

The mixture (`--datasets '[{"path": "a.jsonl", "weight": 2}, {"path": "b.parquet", "records": 500}, ...]'`):
- a source with `records: N` gives N records: a sample without repeats, or whole passes and a sample past its size;
- the sources with a `weight` share what is left in proportion to their weights: as many records as the sources
  hold without repeating one (the mixture stops where the first source runs out, LLaMA-Factory's
  first_exhausted), each source's count within one record of its exact share (largest remainders);
- a source with neither gives all its records.
Which records a source gives depends on --seed and the source alone: the same on every rank and every node, and
in every run with that seed. The mixture's checksum (every source's bytes, format and chosen records) keys the
tokenized cache, so a cluster tokenizes it once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path

from training.data import formats
from training.data.records import Records, check_chat, check_pair, read_objects, resolve_data_path
from training.runtime.errors import InputError

log = logging.getLogger("training.token_cache")  # at INFO on every rank (training.data.token_cache)
SYNCED_DATASETS = ".qwen-tui/datasets"
TABLES = (".parquet", ".arrow")
FILES = (".json", ".jsonl") + TABLES


def synced_dir(repo_id: str) -> Path:
    """Where a hub data set synced by qwen-tui lives, relative to the working directory."""
    return Path(SYNCED_DATASETS) / repo_id.replace("/", "--")


# ------------------------------------------------------------------ reading one container

def _arrow_rows(path: Path) -> list[dict]:
    try:
        import pyarrow.ipc as ipc
    except ImportError:
        raise InputError(f"{path}: reading Arrow needs pyarrow (pip install pyarrow)") from None
    try:
        with open(path, "rb") as f:
            try:
                table = ipc.open_stream(f).read_all()  # what datasets writes
            except Exception:
                f.seek(0)
                table = ipc.open_file(f).read_all()
    except Exception as e:
        raise InputError(f"{path}: not an Arrow file ({type(e).__name__}: {e})") from None
    return table.to_pylist()


def _parquet_rows(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:
        raise InputError(f"{path}: not a Parquet file ({type(e).__name__}: {e})") from None


def _file_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _dir_files(d: Path) -> list[Path]:
    state = d / "state.json"
    if state.is_file():  # datasets.save_to_disk
        try:
            names = [x["filename"] for x in json.loads(state.read_text())["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InputError(f"{d}: unreadable state.json of a saved data set ({e})") from None
        return [d / n for n in names]
    files = sorted(p for p in d.rglob("*") if p.is_file() and p.suffix in FILES and ".git" not in p.parts
                   and not p.name.startswith(".") and p.name != "dataset_info.json")
    if not files:
        raise InputError(f"{d}: no data files in it (.json, .jsonl, .parquet, .arrow, or a save_to_disk folder)")
    return files


def read_rows(path: str) -> tuple[list[tuple[int | None, object]], str, str]:
    """(line or None, record) of every record of a source, its checksum, and the path as read."""
    where = path
    if path.startswith("hf:"):
        local = synced_dir(path[3:])
        if not local.is_dir():
            raise InputError(f"{path}: not on this node ({local} is missing): `qwen-tui check --sync` downloads a hub "
                             "data set on the master and copies it to every node")
        path = str(local)
    p = resolve_data_path(path)
    if path.startswith("builtin:") or p.suffix in (".json", ".jsonl") or (p.is_file() and p.suffix not in TABLES):
        raw, digest = read_objects(path)
        return raw, digest, where
    if not p.exists():
        raise InputError(f"{where}: data file not found")
    files = _dir_files(p) if p.is_dir() else [p]
    rows: list[tuple[int | None, object]] = []
    for f in files:
        if f.suffix == ".parquet":
            rows += [(None, r) for r in _parquet_rows(f)]
        elif f.suffix == ".arrow":
            rows += [(None, r) for r in _arrow_rows(f)]
        else:
            raw, _ = read_objects(str(f))
            rows += raw
    if not rows:
        raise InputError(f"{where}: no records")
    return rows, _file_digest(files), where


def _check(where: str, rows, fmt: str, preference: bool, tags=None) -> list:
    if preference:
        return [check_pair(where, i, line, obj, fmt) for i, (line, obj) in enumerate(rows)]
    return [check_chat(where, i, line, obj, fmt, tags) for i, (line, obj) in enumerate(rows)]


def load_source(path: str, fmt: str = "auto", preference: bool = False) -> Records:
    """Every record of one source, checked."""
    rows, digest, where = read_rows(path)
    return Records(_check(where, rows, fmt, preference),
                   hashlib.sha256(f"{'pairs' if preference else 'chat'}:{fmt}:{digest}".encode()).hexdigest())


# ------------------------------------------------------------------ LLaMA-Factory's dataset_info.json

@dataclass
class InfoEntry:
    path: str
    fmt: str
    columns: dict
    tags: formats.Tags | None
    records: int | None


def info_entry(info_file: str, name: str, preference: bool) -> InfoEntry:
    """One entry of a dataset_info.json, as LLaMA-Factory reads it."""
    f = Path(info_file)
    try:
        info = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{info_file}: cannot read it as JSON ({e})") from None
    if name not in info:
        raise InputError(f"{info_file}: no entry {name!r} (it has {', '.join(sorted(info)[:10])})")
    e = info[name]
    if "file_name" in e:
        path = str(f.parent / e["file_name"])
    elif e.get("hf_hub_url"):
        path = f"hf:{e['hf_hub_url']}"
    else:
        raise InputError(f"{info_file}: entry {name!r} has neither file_name nor hf_hub_url (the other sources "
                         "LLaMA-Factory reads, ms_hub_url and script_url, are not read here)")
    sharegpt = e.get("formatting", "alpaca") == "sharegpt"
    ranking = bool(e.get("ranking"))
    if ranking != preference:
        raise InputError(f"{info_file}: entry {name!r} is {'' if ranking else 'not '}a ranking (preference) data set; "
                         f"this run is {'DPO' if preference else 'SFT'}")
    columns = dict(e.get("columns") or {})
    tags = None
    if sharegpt:
        t = e.get("tags") or {}
        roles = tuple((t[k], kind) for k, kind in (("user_tag", "user"), ("assistant_tag", "assistant"),
                                                   ("observation_tag", "tool"), ("function_tag", "call"),
                                                   ("system_tag", "system")) if k in t)
        tags = formats.Tags(role=t.get("role_tag", "from"), content=t.get("content_tag", "value"), roles=roles)
        fmt = "sharegpt_pref" if ranking else "sharegpt"
    else:
        fmt = "trl" if ranking else "alpaca"
    return InfoEntry(path, fmt, columns, tags, e.get("num_samples"))


def _remap(obj, columns: dict, sharegpt: bool, fmt: str = ""):
    """A row with LLaMA-Factory's column names turned into the canonical ones (an alpaca ranking row into TRL's
    prompt / chosen / rejected strings)."""
    if not isinstance(obj, dict) or not (columns or fmt == "trl"):
        return obj
    canon = {"messages": "conversations" if sharegpt else "messages", "prompt": "instruction" if not sharegpt else
             "prompt", "query": "input", "response": "output", "history": "history", "system": "system",
             "tools": "tools", "chosen": "chosen", "rejected": "rejected"}
    out = dict(obj)
    for ours, theirs in columns.items():
        if ours in canon and theirs in obj:
            out[canon[ours]] = obj[theirs]
    if fmt == "trl" and not sharegpt:
        prompt = "\n".join(p for p in (out.get("instruction"), out.get("input")) if isinstance(p, str) and p)
        return {"id": out.get("id"), "prompt": prompt, "chosen": out.get("chosen"), "rejected": out.get("rejected"),
                "system": out.get("system")}
    return out


# ------------------------------------------------------------------ the mixture

@dataclass
class Mixture:
    records: Records
    summary: list[dict]  # per source: name, path, format, available, taken


def _spec(spec: str) -> list:
    text = spec.strip()
    if not text.startswith("["):
        f = Path(spec)
        try:
            text = f.read_text(encoding="utf-8")
        except OSError as e:
            raise InputError(f"--datasets {spec}: not a JSON list, and no file to read ({e.strerror})") from None
        if f.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
            return data.get("datasets", data) if isinstance(data, dict) else data
    try:
        data = json.loads(text)
    except ValueError as e:
        raise InputError(f"--datasets: not valid JSON: {e}") from None
    return data.get("datasets", data) if isinstance(data, dict) else data


def counts(sizes: list[int], weights: list[float | None], records: list[int | None]) -> list[int]:
    """How many records each source gives (see the module's docstring)."""
    out = [r if r is not None else (s if w is None else 0) for s, w, r in zip(sizes, weights, records)]
    weighted = [i for i, (w, r) in enumerate(zip(weights, records)) if w is not None and r is None]
    if weighted:
        total_w = sum(weights[i] for i in weighted)
        share = {i: weights[i] / total_w for i in weighted}
        n = min(int(sizes[i] / share[i] + 1e-9) for i in weighted)
        exact = {i: n * share[i] for i in weighted}
        base = {i: int(exact[i]) for i in weighted}
        left = n - sum(base.values())
        for i in sorted(weighted, key=lambda i: (-(exact[i] - base[i]), i))[:left]:
            base[i] += 1
        for i in weighted:
            out[i] = base[i]
    return out


def _pick(size: int, n: int, seed: int, key: str) -> list[int]:
    rng = random.Random(f"{seed}:{key}")
    picked = list(range(size)) * (n // size) + sorted(rng.sample(range(size), n % size))
    return picked


def load_mixture(spec: str, seed: int, preference: bool = False, default_format: str = "auto") -> Mixture:
    entries = _spec(spec)
    if not isinstance(entries, list) or not entries:
        raise InputError("--datasets: expected a non-empty list of sources")
    loaded = []
    for k, e in enumerate(entries):
        where = f"--datasets[{k}]"
        if isinstance(e, str):
            e = {"path": e}
        if not isinstance(e, dict):
            raise InputError(f"{where}: a source is an object with 'path' (or 'dataset_info' and 'name')")
        unknown = set(e) - {"path", "format", "weight", "records", "name", "dataset_info"}
        if unknown:
            raise InputError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (path, format, weight, records, "
                             "name, dataset_info)")
        weight, n = e.get("weight"), e.get("records")
        if weight is not None and (not isinstance(weight, (int, float)) or weight <= 0):
            raise InputError(f"{where}.weight must be a positive number, got {weight!r}")
        if n is not None and (not isinstance(n, int) or n <= 0):
            raise InputError(f"{where}.records must be a positive whole number, got {n!r}")
        if weight is not None and n is not None:
            raise InputError(f"{where}: give weight or records, not both")
        columns, tags, sharegpt = {}, None, False
        if e.get("dataset_info"):
            if not e.get("name"):
                raise InputError(f"{where}: dataset_info needs the entry's name")
            info = info_entry(e["dataset_info"], e["name"], preference)
            path, fmt, columns, tags = info.path, info.fmt, info.columns, info.tags
            sharegpt = fmt.startswith("sharegpt")
            n = n if n is not None or weight is not None else info.records
        elif e.get("path"):
            path, fmt = str(e["path"]), e.get("format") or default_format
            if fmt not in formats.FORMATS:
                raise InputError(f"{where}.format: unknown format {fmt!r}; known: {', '.join(formats.FORMATS)}")
        else:
            raise InputError(f"{where}: no 'path' (or 'dataset_info' and 'name')")
        rows, digest, shown = read_rows(path)
        if e.get("dataset_info"):
            rows = [(line, _remap(obj, columns, sharegpt, fmt)) for line, obj in rows]
        checked = _check(shown, rows, fmt, preference, tags)
        name = str(e.get("name") or os.path.basename(shown.rstrip("/")) or shown)
        loaded.append((name, shown, fmt, checked, digest, weight, n))
    sizes = [len(x[3]) for x in loaded]
    taken = counts(sizes, [x[5] for x in loaded], [x[6] for x in loaded])
    items, summary, h = [], [], hashlib.sha256(f"mixture:{'pairs' if preference else 'chat'}:{seed}".encode())
    for (name, shown, fmt, checked, digest, weight, _), size, take in zip(loaded, sizes, taken):
        picked = _pick(size, take, seed, digest)
        h.update(json.dumps([digest, fmt, picked]).encode())
        items += [checked[i] for i in picked]
        summary.append({"name": name, "path": shown, "format": fmt, "weight": weight, "available": size,
                        "records": take, "repeated": take > size})
        if take > size:
            log.warning("%s: %d records asked for, %d there: %d whole passes and a sample", name, take, size,
                        take // size)
    log.info("data mixture (seed %d): %s", seed, ", ".join(f"{s['name']} {s['records']}/{s['available']}"
                                                            for s in summary))
    return Mixture(Records(items, h.hexdigest()), summary)
