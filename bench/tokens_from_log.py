"""Real tokens/s of an "ours" configuration from its worker's step lines in a train_speed runs.log.

    python bench/tokens_from_log.py RUNS.LOG CONFIG [--warmup 2] [--steps 10] [--records-per-step 64]

For a run whose results.json entry is missing (the bench was stopped after the worker's last step, while
it saved the model, say). The worker logs each step's tokens/s; the tokens of every step follow from the
bench's synthetic records and the worker's sampler (seed 42), the same ones the run used, so each step's
time is its tokens over its tokens/s. Prints the timed steps' tokens, seconds and tokens/s. On a run
that has its results.json entry it reproduces that entry's tokens_per_s (run8's and run9's do).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("log")
    p.add_argument("config")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--records-per-step", type=int, default=64)
    args = p.parse_args(argv)
    import train_speed as ts

    from training.data.batches import StepSampler

    text = Path(args.log).read_text()
    marker = f"===== {args.config}:"
    if marker not in text:
        print(f"{args.log}: no run of {args.config}", file=sys.stderr)
        return 2
    section = text.split(marker, 1)[1].split("\n=====", 1)[0]
    rates = [float(x) for x in re.findall(r"INFO step \d+/\d+ .* (\d+) tok/s", section)]
    n = args.warmup + args.steps
    if len(rates) < n:
        print(f"{args.config}: {len(rates)} step lines, {n} needed", file=sys.stderr)
        return 1
    base = args.config.split("+")[0]
    vocab = ts.SHAPES[ts.CONFIGS[base]["shape"]]["vocab_size"]
    lens = [len(r.input_ids) for r in ts.make_records(n * args.records_per_step, vocab, seed=0)]
    sampler = StepSampler(len(lens), 1, 0, args.records_per_step, 1, 42, len(rates))
    tokens = [sum(lens[i] for i in batch) for batch in sampler]
    timed = range(args.warmup, n)
    secs = sum(tokens[i] / rates[i] for i in timed)
    total = sum(tokens[i] for i in timed)
    print(f"{args.config}: {len(timed)} timed steps, {total} real tokens in {secs:.3f} s: {total / secs:,.0f} tokens/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
