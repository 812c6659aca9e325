"""Builds a tiny Qwen model (training.model.tiny) into a directory and prints {"model_dir": ...} as JSON.

    python -m training.tiny OUT_DIR [KIND]   # build (idempotent); KIND qwen2 (default), qwen3_moe or qwen2_moe
"""

from __future__ import annotations

import json
import sys

from training.model.tiny import BUILTINS, build_tiny


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    kinds = sorted(set(BUILTINS.values()))
    if len(argv) not in (1, 2) or argv[0] in ("-h", "--help") or (len(argv) == 2 and argv[1] not in kinds):
        print(f"usage: python -m training.tiny OUT_DIR [{'|'.join(kinds)}]", file=sys.stderr)
        return 2
    out = build_tiny(argv[0], argv[1] if len(argv) == 2 else "qwen2")
    print(json.dumps({"model_dir": str(out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
