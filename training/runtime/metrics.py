"""OUTPUT_DIR/metrics.jsonl: one JSON object per line, appended and flushed, rank 0 only.

The monitor tails this file while training runs, so a record is written in
one call and flushed at once; the file is never rewritten. Sinks (rank 0's
trackers, training.runtime.trackers) get every record as written, so they log the
same figures.
"""

from __future__ import annotations

import json
import math
import os
import time


class MetricsWriter:
    def __init__(self, path: str, enabled: bool):
        self.path = path
        self.enabled = enabled
        self._f = None
        self.sinks: list = []  # objects with log_record(record) and close()

    def add_sink(self, sink) -> None:
        self.sinks.append(sink)

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        if self._f is None:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            # 0600, as every file of a run directory (it lives there when qwen-tui launched the run)
            self._f = os.fdopen(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a",
                                encoding="utf-8")
        rec = {k: _clean(v) for k, v in record.items()}
        rec.setdefault("time", time.time())
        self._f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self._f.flush()
        for sink in self.sinks:
            sink.log_record(rec)

    def close(self) -> None:
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()
        if self._f is not None:
            self._f.close()
            self._f = None


def _clean(v):
    # JSON has no NaN/Infinity: a diverged loss is written as null, not as invalid JSON.
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
