"""One of the worker's tools (python -m training.X) on a node, its answer the last JSON line of its stdout: the data
preview, merge and chat all run this way, on the master, through its transport."""

from __future__ import annotations

import json
from typing import Any

from ...base.shell import quote_argv
from ...nodes.transport.protocol import Transport

# The tools' own chatter (tokenizer forks, download bars) kept out of stdout and stderr.
TOOL_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def run_json_tool(transport: Transport, argv: list[str], *, cwd: str | None, timeout: float, what: str,
                  error: type[Exception], input: bytes | None = None) -> dict[str, Any]:
    """Runs argv on the node and returns its last stdout line as JSON. A failure raises `error` with the tool's own
    "error: ..." line and the indented lines that go on from it (else its last stderr line), or that it did not answer
    within `timeout`."""
    r = transport.run(argv, timeout=timeout, cwd=cwd, env=TOOL_ENV, input=input)
    where = f"node 0 ({transport.label})"
    if r.rc != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        at = max((i for i, ln in enumerate(lines) if ln.startswith("error: ")), default=None)
        why = lines[at][len("error: "):] if at is not None else (lines[-1] if lines else f"exit {r.rc}")
        # an error of several lines (every problem of a data file) goes on in indented lines after its first
        more = [ln for ln in lines[at + 1:] if ln.startswith(" ")] if at is not None else []
        if r.rc == 124:
            why, more = f"no answer within {timeout:g} s", []
        raise error("\n".join([f"{what} on {where} failed: {why}  [{quote_argv(argv[:3])} ...]", *more]))
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise error(f"{what} on {where}: no JSON on stdout: {r.stdout[-300:]!r}") from None
