"""Writes demo_pref.jsonl: the small preference set behind `--data_path builtin:demo-pref` (DPO's demo).

Run `python -m training.demo_data.make_demo_pref` to regenerate it; the output is byte-for-byte deterministic.

Pairs in TRL's conversational form (prompt / chosen / rejected message lists), built from the demo chat set: the
prompt is a demo conversation up to its last question, the chosen answer the demo's own, the rejected one either
another record's answer to another question or a refusal. The preference is learnable on purpose: after a few
DPO steps the tiny model must rank the chosen answer above the rejected one more often than not.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from training.demo_data.make_demo_chat import build

OUT = Path(__file__).with_name("demo_pref.jsonl")
N_PAIRS = 240
SEED = 20241205
REFUSALS = ["Sorry, I cannot help with that.", "I do not know.", "Ask someone else."]


def _messages(turns: list[dict]) -> list[dict]:
    return [{"role": t["from"], "content": t["value"]} for t in turns]


def build_pairs() -> list[dict]:
    rng = random.Random(SEED)
    chats = build()
    pairs = []
    for i, rec in enumerate(chats[:N_PAIRS]):
        conv = rec["conversations"]
        answer = conv[-1]["value"]
        if rng.random() < 0.5:
            other = chats[(i + 1 + rng.randrange(len(chats) - 1)) % len(chats)]["conversations"][-1]["value"]
            rejected = other if other != answer else rng.choice(REFUSALS)
        else:
            rejected = rng.choice(REFUSALS)
        pairs.append({"id": f"pref-{i:04d}", "prompt": _messages(conv[:-1]),
                      "chosen": [{"role": "assistant", "content": answer}],
                      "rejected": [{"role": "assistant", "content": rejected}]})
    return pairs


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for rec in build_pairs():
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"wrote {N_PAIRS} pairs to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
