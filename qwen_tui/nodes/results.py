"""Per-node results: every remote action answers for every node.

`NodeResults` maps node index -> value, or -> the exception that node raised
(the shape of fabric's GroupResult). `on_nodes` runs one function per node in
parallel threads under one overall bound, so a hung node costs the bound, not
the sum, and one failure never hides the others.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class NodeTimeout(TimeoutError):
    """The node did not answer within the overall bound of a parallel action."""


class NodeResults(dict, Generic[T]):
    """node index -> value | BaseException. `labels` names nodes in messages."""

    def __init__(self, data: Mapping[int, object] | None = None, labels: Mapping[int, str] | None = None):
        super().__init__(data or {})
        self.labels: dict[int, str] = dict(labels or {})

    @property
    def succeeded(self) -> dict[int, T]:
        return {i: v for i, v in self.items() if not isinstance(v, BaseException)}

    @property
    def failed(self) -> dict[int, BaseException]:
        return {i: v for i, v in self.items() if isinstance(v, BaseException)}

    @property
    def ok(self) -> bool:
        return not self.failed

    def label(self, i: int) -> str:
        return self.labels.get(i, f"node {i}")

    def errors_text(self) -> list[str]:
        return [f"node {i} ({self.label(i)}): {e}" for i, e in sorted(self.failed.items())]


def on_nodes(fn: Callable[[int], T], indices: Iterable[int], *, timeout: float,
             labels: Mapping[int, str] | None = None) -> NodeResults[T]:
    """Call fn(i) for every node index in parallel; wait at most `timeout` seconds.

    A node still running at the bound gets a NodeTimeout (its thread is left to end
    on its own: every remote call has its own timeout, so it does end).
    """
    idx = list(indices)
    res: NodeResults[T] = NodeResults(labels=labels)
    if not idx:
        return res
    pool = cf.ThreadPoolExecutor(max_workers=len(idx), thread_name_prefix="node")
    futs = {pool.submit(fn, i): i for i in idx}
    deadline = time.monotonic() + timeout
    try:
        for fut in cf.as_completed(futs, timeout=max(0.0, deadline - time.monotonic())):
            i = futs[fut]
            try:
                res[i] = fut.result()
            except BaseException as e:
                res[i] = e
    except cf.TimeoutError:
        pass  # the nodes that did not answer in time are marked just below
    for i in futs.values():
        if i not in res:
            res[i] = NodeTimeout(f"no answer within {timeout:g}s")
    pool.shutdown(wait=False, cancel_futures=True)
    return NodeResults({i: res[i] for i in idx}, labels=labels)
