"""`--facts FILE` of the commands that read the nodes' facts without asking the nodes (estimate, data)."""

from __future__ import annotations

import json

from ..cluster.facts import ClusterFacts


def read_facts_file(path: str) -> ClusterFacts:
    """ClusterFacts.to_dict(), or the whole `qwen-tui check --json/--out` result that holds it. Raises ValueError
    (a clear message) for a file that cannot be read or holds neither."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return ClusterFacts.from_dict(data["facts"] if isinstance(data.get("facts"), dict) else data)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: cannot read facts: {e}") from None
