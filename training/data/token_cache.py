"""Tokenize once: a cache of tokenized data sets, shared by the ranks of a node (or of every node).

Without it every rank of every node tokenizes the whole data set; on big sets the ranks that finish
first wait in the process group's set-up for the slowest, up to the distributed timeout.

Who does what (no process group exists yet when the data is tokenized, so ranks agree through files):
- Local rank 0 of each node is a builder candidate. It reuses the cache file when there is one,
  else takes the build lock (created exclusively) and tokenizes. On storage every node sees, one
  candidate gets the lock and the others wait like the rest: one rank overall tokenizes.
- The other ranks wait, with a bound (--tokenize_timeout), for the cache file, then load it.
- The builder keeps the lock's mtime fresh while it works; a lock left by a builder that died is
  taken over by a candidate once it is stale. A builder that fails leaves a `.failed` note with its
  error, which the waiters of the same job raise at once instead of waiting out the bound.

The key: the data file's SHA-256, the tokenizer (its serialized form: vocabulary, merges, normalizer,
added tokens), the chat template actually used, the max length, the encoder's own code and the
transformers/tokenizers versions. Packing does not change a record's tokens (it only places records
in rows), so it is not part of the key. --lazy_preprocess tokenizes on the fly and uses no cache.

Each rank that gets the data set logs one line: "tokenized cache built", "reused" (a candidate found an
earlier run's file) or "loaded" (this run's build, read by a rank that waited for it): a test counts them.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from training.data import encoding
from training.data.encoding import IGNORE_INDEX, DataStats, EagerDataset, Encoded
from training.runtime import build_lock
from training.runtime.errors import InputError

log = logging.getLogger("training.token_cache")
log.setLevel(logging.INFO)  # every rank's line, not only rank 0's: the logs count builds per node

FORMAT = 1
POLL_S = 0.2
STALE_S = build_lock.STALE_S


@dataclass
class Settings:
    directory: Path | None  # None: no cache
    timeout_s: float = 3600.0


_settings = Settings(directory=None)


def default_dir() -> Path:
    """$QWEN_TUI_TOKENIZED_CACHE, else the cache root's tokenized/ ($QWEN_TUI_CACHE, else $XDG_CACHE_HOME/qwen-tui,
    else ~/.cache/qwen-tui)."""
    from training.runtime.cachedir import cache_root

    if os.environ.get("QWEN_TUI_TOKENIZED_CACHE"):
        return Path(os.environ["QWEN_TUI_TOKENIZED_CACHE"]).expanduser()
    return cache_root() / "tokenized"


def configure(directory: str | None, timeout_s: float) -> Settings:
    """Set once per process from the worker's flags: DIR, 'none' (off), or None (the default directory)."""
    global _settings
    if directory is not None and directory.strip().lower() == "none":
        _settings = Settings(directory=None, timeout_s=timeout_s)
    else:
        _settings = Settings(Path(directory).expanduser() if directory else default_dir(), timeout_s)
    return _settings


def settings() -> Settings:
    return _settings


# ------------------------------------------------------------------ the key

def _encoder_source() -> str:
    """The encoder's code: a change to it invalidates every cache. Without sources (a bytecode-only install),
    the module's compiled code stands in."""
    try:
        return inspect.getsource(encoding.ChatEncoder) + inspect.getsource(encoding.EagerDataset) + \
            inspect.getsource(encoding._has_labels)
    except (OSError, TypeError):
        return repr([encoding.ChatEncoder.encode.__code__.co_code,
                     encoding.ChatEncoder.assistant_spans.__code__.co_code])


def cache_key(convs, encoder) -> str:
    import tokenizers
    import transformers

    h = hashlib.sha256()
    tok = encoder.tok
    meta = {
        "format": FORMAT, "max_length": encoder.max_length, "tokenizer_class": type(tok).__name__,
        "chat_template": tok.chat_template, "header": encoder.header, "end_of_turn": encoder.end_of_turn,
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "encoder": hashlib.sha256(_encoder_source().encode()).hexdigest(),
    }
    h.update(json.dumps(meta, sort_keys=True).encode())
    backend = getattr(tok, "backend_tokenizer", None)
    h.update(backend.to_str().encode() if backend is not None else
             json.dumps(sorted(tok.get_vocab().items())).encode())
    digest = getattr(convs, "sha256", None)
    if digest:  # the file's bytes (records.Records)
        h.update(b"file:" + digest.encode())
    else:  # a plain list of records: their content
        for c in convs:
            h.update(json.dumps([c.id, list(c.messages)], ensure_ascii=False, sort_keys=True).encode())
    return h.hexdigest()[:32]


# ------------------------------------------------------------------ the file

def _save(path: Path, ds) -> None:
    """Atomically: a temp file in the same directory, renamed over the target."""
    ids = [torch.tensor(e.input_ids, dtype=torch.int32) for e in ds.items]
    lens = torch.tensor([len(e.input_ids) for e in ds.items], dtype=torch.int64)
    labelled = [torch.tensor([x != -100 for x in e.labels], dtype=torch.bool) for e in ds.items]
    payload = {
        "format": FORMAT,
        "ids": torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int32),
        "labelled": torch.cat(labelled) if labelled else torch.zeros(0, dtype=torch.bool),
        "lengths": lens,
        "truncated": torch.tensor([e.truncated for e in ds.items], dtype=torch.bool),
        "stats": json.dumps(asdict(ds.stats)),
    }
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        with open(tmp, "xb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _load(path: Path):
    p = torch.load(path, map_location="cpu", weights_only=True)  # tensors, ints and strings only
    if p.get("format") != FORMAT:
        raise ValueError(f"format {p.get('format')!r}, expected {FORMAT}")
    ids, lab, lens, trunc = p["ids"].tolist(), p["labelled"].tolist(), p["lengths"].tolist(), p["truncated"].tolist()
    if len(ids) != sum(lens) or len(lab) != len(ids) or len(trunc) != len(lens):
        raise ValueError("arrays of different lengths")
    items, at = [], 0
    for n, t in zip(lens, trunc):
        seq = ids[at:at + n]
        items.append(Encoded(seq, [x if keep else IGNORE_INDEX for x, keep in zip(seq, lab[at:at + n])], bool(t)))
        at += n
    return EagerDataset.from_items(items, DataStats(**json.loads(p["stats"])))


# ------------------------------------------------------------------ who builds, who waits

def _job() -> str | None:
    """This job's id, the same on every rank: stale notes of earlier runs are told apart by it."""
    run = os.environ.get("QWEN_TUI_RUN_ID")
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    return run or (elastic if elastic and elastic != "none" else None)


def _take(lock: Path) -> bool:
    """True if this process now holds the build lock (created, or taken over from a dead builder)."""
    return build_lock.take(lock, log, "tokenized cache: taking over the stale build lock", job=_job())


def _stamp(path: Path):
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def _failure(failed: Path, what: str, since: float) -> Exception | None:
    """The error a builder of this job left, if any, as the exception to raise here."""
    try:
        d = json.loads(failed.read_text())
        mtime = failed.stat().st_mtime
    except (OSError, ValueError):
        return None
    job = _job()
    if not (d.get("job") == job if job else mtime >= since):
        return None
    text = f"tokenizing {what} failed on {d.get('host')} pid {d.get('pid')}: {d.get('error')}"
    return InputError(text) if d.get("input_error") else RuntimeError(text)


def _build(path: Path, lock: Path, failed: Path, build, what: str):
    t0 = time.monotonic()
    try:
        failed.unlink(missing_ok=True)
        with build_lock.Heartbeat(lock, "token-cache-heartbeat"):
            ds = build()
            _save(path, ds)
    except BaseException as e:
        note = {"host": socket.gethostname(), "pid": os.getpid(), "job": _job(), "error": str(e) or type(e).__name__,
                "input_error": isinstance(e, InputError)}
        try:
            tmp = failed.with_name(f"{failed.name}.{os.getpid()}")
            tmp.write_text(json.dumps(note))
            os.replace(tmp, failed)
        except OSError as oe:
            log.warning("tokenized cache: could not leave the failure note %s: %s", failed, oe)
        raise
    finally:
        lock.unlink(missing_ok=True)
    log.info("tokenized cache built: %s (%s: %d records in %.1f s)", path, what, len(ds), time.monotonic() - t0)
    return ds


def cached_dataset(convs, encoder, build, what: str):
    """The tokenized data set of `convs`: built here, reused, or loaded from another rank's build.

    `build()` tokenizes (an EagerDataset). Without a cache directory it is simply called."""
    s = _settings
    if s.directory is None:
        return build()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    try:
        s.directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--tokenized_cache_dir {s.directory}: cannot create it: {e.strerror} "
                         f"(give another directory, or 'none' to tokenize without a cache)") from None
    key = cache_key(convs, encoder)
    path = s.directory / f"{key}.pt"
    lock, failed = path.with_suffix(".lock"), path.with_suffix(".failed")
    since = time.time() - 2.0  # notes older than this wait began belong to earlier runs (when no job id is known)
    deadline = time.monotonic() + s.timeout_s
    candidate = local_rank == 0
    bad_load, bad_stamp = None, None
    first = True
    while True:
        if not first:
            time.sleep(POLL_S)
        stamp = _stamp(path)
        if stamp is not None and stamp != bad_stamp:
            try:
                ds = _load(path)
            except Exception as e:  # a truncated or foreign file: rebuild it (candidates) or wait for a new one
                bad_load, bad_stamp = f"{type(e).__name__}: {e}", stamp
                if candidate and _take(lock):
                    log.warning("tokenized cache: %s unreadable (%s): building it again", path, bad_load)
                    return _build(path, lock, failed, build, what)
            else:
                # "reused": a builder candidate found an earlier run's file; "loaded": this run's build, or a waiter
                log.info("tokenized cache %s: %s (%s: %d records)", "reused" if candidate and first else "loaded",
                         path, what, len(ds))
                return ds
        elif candidate and _take(lock):  # no file (or the unreadable one's builder is gone)
            if _stamp(path) != stamp:  # another builder finished meanwhile
                lock.unlink(missing_ok=True)
                first = False
                continue
            return _build(path, lock, failed, build, what)
        err = _failure(failed, what, since)
        if err:
            raise err
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"waited {s.timeout_s:g} s for the tokenized cache of {what} ({path}, build lock held by "
                f"{build_lock.holder(lock, 'no builder seen')}{'; last read: ' + bad_load if bad_load else ''}); raise --tokenize_timeout, "
                f"or --tokenized_cache_dir none to tokenize on every rank")
        first = False
