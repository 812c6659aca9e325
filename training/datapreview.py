"""What the worker would make of its data, without training: `python -m training.datapreview`.

    python -m training.datapreview --world_size 2 -- WORKER_FLAGS...

WORKER_FLAGS are the worker's own (`--model_name_or_path --data_path --output_dir
--model_max_length ...`, as the launcher passes them to training.finetune). The
records are read and tokenized exactly as the worker does it (training.data.records,
the model's tokenizer and chat template through training.data.encoding.ChatEncoder, and
the worker's EagerDataset for the counts), so the counts here are the ones the
worker's start record and log give. Prints one JSON object on stdout: the counts,
the untruncated length of every record as percentiles and a histogram, the steps
and tokens of an epoch, and the share of padding the worker's batches would carry
(packed rows, or micro-batches padded to their longest record). Nothing is written.

Exit codes as the worker's: 0 done; 2 bad input (one line on stderr); 1 anything else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time

from training.flags import DataFlags, FastFlags, TrainFlags, WorkerFlags
from training.runtime.errors import EXIT_BAD_INPUT, EXIT_OK, InputError, report_failure

HIST_BINS = 16
WASTE_STEPS = 1000  # the padding share is measured over at most this many steps of the first epoch


def _percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile (a value that occurs in the data)."""
    k = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[k - 1]


def histogram(lengths: list[int], bins: int = HIST_BINS) -> dict:
    """Equal-width bins from the shortest to the longest record: edges (bins + 1) and counts; bin i holds the
    lengths in [edges[i], edges[i+1])."""
    lo, hi = min(lengths), max(lengths)
    width = max(1, math.ceil((hi - lo + 1) / bins))
    bins = math.ceil((hi - lo + 1) / width)  # no empty bins past the longest record
    edges = [lo + i * width for i in range(bins + 1)]
    counts = [0] * bins
    for n in lengths:
        counts[(n - lo) // width] += 1
    return {"edges": edges, "counts": counts}


class _MeasuringEncoder:
    """The worker's ChatEncoder with no length limit, cut to model_max_length here as ChatEncoder.encode cuts:
    one tokenization gives both the record's whole length (for the percentiles) and what the worker trains on."""

    def __init__(self, tokenizer, max_length: int):
        from training.data.encoding import ChatEncoder

        self.inner = ChatEncoder(tokenizer, 1 << 62)
        self.max_length = max_length
        self.full_lengths: list[int] = []

    def encode(self, conv):
        from training.data.encoding import Encoded

        e = self.inner.encode(conv)
        self.full_lengths.append(len(e.input_ids))
        if len(e.input_ids) <= self.max_length:
            return e
        return Encoded(e.input_ids[: self.max_length], e.labels[: self.max_length], True)


def _records(d: DataFlags, seed: int, dpo: bool):
    """(conversations, the mixture's sources or None, the number of pairs or None) of `d`'s data (a mixture's draw
    is --seed's): a DPO set's pairs are counted as their two conversations, the chosen and the rejected."""
    from training.data.records import load_conversations, load_pairs

    sources = None
    if d.datasets:
        from training.data.sources import load_mixture

        mix = load_mixture(d.datasets, seed, preference=dpo, default_format=d.data_format)
        records, sources = mix.records, mix.summary
    else:
        records = load_pairs(d.data_path, d.data_format) if dpo else load_conversations(d.data_path, d.data_format)
    if not dpo:
        return list(records), sources, None
    return [c for p in records for c in (p.chosen, p.rejected)], sources, len(records)


def tool_counts(convs, encoder) -> dict:
    """Tool calls and tool results, and their tokens in the template's rendering: the calls are trained on (the
    assistant writes them), the results and the tools' schemas are not."""
    out = {"records_with_tools": 0, "tool_calls": 0, "tool_results": 0, "call_tokens": 0, "result_tokens": 0}
    for conv in convs:
        calls = sum(len(m.get("tool_calls") or ()) for m in conv.messages)
        results = sum(m["role"] == "tool" for m in conv.messages)
        if not (calls or results or conv.tools):
            continue
        out["records_with_tools"] += 1
        out["tool_calls"] += calls
        out["tool_results"] += results
        text = encoder.render(conv.messages, tools=conv.tools)
        parts: list = []
        encoder.assistant_spans(text, conv, parts)
        offsets = encoder.tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        for kind, a, b in parts:
            n = sum(1 for x, y in offsets if y > x and a <= x and y <= b)
            out["call_tokens" if kind == "call" else "result_tokens"] += n
    return out


def packing_on(fast: FastFlags) -> bool:
    """The worker's packing choice (training.fast.choice.decide) as far as it follows from the flags: on unless
    --no_packing (the CUDA varlen-attention check needs the node's GPU stack and is assumed to pass)."""
    return True if fast.packing is None else bool(fast.packing)


def padding_waste(lengths: list[int], train: TrainFlags, packing_tokens: int | None, max_length: int, world_size: int,
                  steps_per_epoch: int, packing: bool, cuda: bool) -> dict:
    """Share of the tokens the worker's batches compute that are padding, over the first epoch's steps in the
    worker's own data order (training.data.batches.StepSampler, every rank). packing_tokens: --packing_tokens as
    given; max_length: --model_max_length."""
    from training.data.batches import StepSampler
    from training.fast.packing import balanced_bins

    mb, gas = train.per_device_train_batch_size, train.gradient_accumulation_steps
    capacity = packing_tokens or mb * max_length
    base = 128 if cuda else 8  # the recipe's row widths (FinetuneRecipe._pad_multiple), a multiple of the SP size
    pad_multiple = base * train.sequence_parallel_size // math.gcd(base, train.sequence_parallel_size)
    collate_multiple = 8 if cuda else 1  # the recipe's Collator for unpacked micro-batches
    steps = min(steps_per_epoch, WASTE_STEPS)
    samplers = [iter(StepSampler(len(lengths), world_size, r, mb, gas, train.seed, steps))
                for r in range(world_size)]
    real = computed = 0
    for _ in range(steps):
        per_rank = [[next(s) for _ in range(gas)] for s in samplers]
        if packing:
            widths = []
            for micro in per_rank:
                lens = [lengths[i] for m in micro for i in m]
                real += sum(lens)
                rows = [sum(lens[i] for i in b) for b in balanced_bins(lens, capacity)]
                widths.append([min(capacity, -(-t // pad_multiple) * pad_multiple) for t in rows])
            most = max(len(w) for w in widths)
            filler = min(pad_multiple, capacity)  # ranks with fewer rows run empty ones (training.fast.apply.empty_row)
            computed += sum(sum(w) + (most - len(w)) * filler for w in widths)
        else:
            for micro in per_rank:
                for m in micro:
                    lens = [lengths[i] for i in m]
                    real += sum(lens)
                    computed += len(lens) * (-(-max(lens) // collate_multiple) * collate_multiple)
    return {"packing": packing, "packing_tokens": capacity if packing else None, "steps_measured": steps,
            "padding_waste": round(1 - real / computed, 4) if computed else 0.0}


def max_positions(source: str) -> int | None:
    """The positions the model was built for (config.json's max_position_embeddings), where its directory says."""
    import os

    try:
        with open(os.path.join(source, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    n = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
    return n if isinstance(n, int) and n > 0 else None


def preview(args: WorkerFlags, world_size: int, cuda: bool, bins: int = HIST_BINS, longer_than: int | None = None) -> dict:
    from training.data.encoding import EagerDataset
    from training.model.pretrained import load_tokenizer, resolve_model_source

    t0 = time.monotonic()
    try:
        convs, sources, pairs = _records(args.data, args.train.seed, args.pref.stage == "dpo")
    except InputError as first:
        # the worker stops at the first bad record; the preview reads on and reports every kind of problem at once
        if args.data.datasets or args.pref.stage == "dpo" or args.data.data_format != "auto":
            raise
        from training.data.problems import report

        try:
            every = report(args.data.data_path)
        except InputError:  # a file that cannot be read at all: the first error says so
            raise first from None
        if every is None:
            raise
        raise InputError(every) from None
    source = resolve_model_source(args.model.model_name_or_path, 0)
    tokenizer = load_tokenizer(source)
    enc = _MeasuringEncoder(tokenizer, args.data.model_max_length)
    ds = EagerDataset(convs, enc)
    s = ds.stats
    tools = tool_counts(convs, enc.inner)
    if sources:  # each source's share of the records and their tokens (records come source after source)
        at = 0
        for src in sources:
            n = src["records"]
            src["tokens"] = sum(enc.full_lengths[at * (2 if pairs else 1):(at + n) * (2 if pairs else 1)])
            at += n
        total = sum(x["tokens"] for x in sources) or 1
        for src in sources:
            src["share_records"] = round(src["records"] / max(at, 1), 4)
            src["share_tokens"] = round(src["tokens"] / total, 4)
    full = sorted(enc.full_lengths)
    used = [len(e.input_ids) for e in ds.items]
    # The ranks of a sequence-parallel group share their records: the sampler deals to the groups.
    data_world = max(1, world_size // args.train.sequence_parallel_size)
    global_batch = data_world * args.train.per_device_train_batch_size * args.train.gradient_accumulation_steps
    steps_per_epoch = len(ds) // global_batch
    total_steps = (args.train.max_steps if args.train.max_steps > 0
                   else math.ceil(args.train.num_train_epochs * steps_per_epoch))
    if pairs:  # DPO: a pair is one sample of the sampler (both its answers in one row)
        steps_per_epoch = (len(ds) // 2) // global_batch
        total_steps = (args.train.max_steps if args.train.max_steps > 0
                       else math.ceil(args.train.num_train_epochs * steps_per_epoch))
    records_per_epoch = steps_per_epoch * global_batch * (2 if pairs else 1)
    # Records beyond the last full global batch sit out each epoch (a different few each time): expected tokens.
    tokens_per_epoch = round(s.tokens * records_per_epoch / len(ds)) if len(ds) else 0
    packing = packing_on(args.fast)
    waste = padding_waste(used, args.train, args.fast.packing_tokens, args.data.model_max_length, data_world,
                          steps_per_epoch, packing, cuda) if steps_per_epoch \
        else {"packing": packing, "packing_tokens": None, "steps_measured": 0, "padding_waste": None}
    return {
        "stage": args.pref.stage, "pairs": pairs, "tools": tools, "sources": sources,
        "data": args.data.data_path or ", ".join(x["name"] for x in sources or []),
        "model": args.model.model_name_or_path,
        "model_max_length": args.data.model_max_length, "max_positions": max_positions(source),
        "records": s.records, "usable": len(ds), "dropped": s.dropped, "truncated": s.truncated,
        "truncated_ids": s.truncated_ids[:5],
        "tokens": s.tokens, "supervised_tokens": s.label_tokens,
        "length_percentiles": {"p50": _percentile(full, 50), "p90": _percentile(full, 90),
                               "p99": _percentile(full, 99), "max": full[-1]},
        "histogram": histogram(full, bins),
        "world_size": world_size, "global_batch_size": global_batch, "steps_per_epoch": steps_per_epoch,
        "total_steps": total_steps, "records_per_epoch": records_per_epoch, "tokens_per_epoch": tokens_per_epoch,
        "sequence_parallel_size": args.train.sequence_parallel_size,
        # records (as cut to model_max_length) longer than the caller's limit: the longest a GPU trains
        "longer_than": ({"tokens": longer_than, "records": sum(1 for n in used if n > longer_than),
                         "longest": max(used, default=0)} if longer_than else None),
        **waste, "seconds": round(time.monotonic() - t0, 3),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, worker = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m training.datapreview", description=__doc__.split("\n\n")[0],
                                epilog="after --: the worker's flags (python -m training.finetune --help)")
    p.add_argument("--world_size", type=int, default=1, help="processes of the run, all nodes together (default 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda",
                   help="where the run trains: sets the row and batch padding multiples (default cuda)")
    p.add_argument("--bins", type=int, default=HIST_BINS, help=f"histogram bins (default {HIST_BINS})")
    p.add_argument("--longer_than", type=int, default=None, metavar="TOKENS",
                   help="also count the records (as cut to --model_max_length) longer than this")
    mine = p.parse_args(ours)
    if mine.world_size < 1 or mine.bins < 1:
        print("training.datapreview: --world_size and --bins must be positive", file=sys.stderr)
        return EXIT_BAD_INPUT
    import logging
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
    from training.args import parse_args

    try:
        args = parse_args(worker)
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON alone (a model build may print)
            report = preview(args, mine.world_size, mine.device == "cuda" and "--use_cpu" not in worker, mine.bins,
                             mine.longer_than)
    except Exception as e:
        return report_failure(e)
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
