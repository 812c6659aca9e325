"""The data preview: what the worker will make of a preset's data, and how long an epoch will take.

The counting (the model's own tokenizer and chat template, through the worker's
encoder) runs on the master node as `python -m training.datapreview` (preview_command), with the
worker's own flags from the plan: this process never imports torch or
transformers, and a remote master previews its own copy of the data (run/tools/data_preview.py runs it
there; nothing here talks to a node). Here the counts meet the estimate's tokens/s (qwen_tui.plan.estimate)
to give the time per epoch and per run, and the rules that warn about the data.

`--json` keys (stable): records, usable, dropped, truncated, tokens,
supervised_tokens, length_percentiles {p50, p90, p99, max}, tokens_per_epoch,
epoch_seconds; and the details: histogram, supervised_share, steps_per_epoch, stage, pairs (DPO), tools
{records_with_tools, tool_calls, tool_results, call_tokens, result_tokens}, sources (a mixture: per source name,
format, available, records, tokens, share_records, share_tokens),
total_steps, padding_waste, tokens_per_second, run_seconds, advice; where the GPU and the model are known,
longest_trainable (the longest record one GPU trains, qwen_tui.plan.longcontext) and longer_than (the records past it).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..base.levels import Level
from ..cluster.facts import ClusterFacts
from ..plan.estimate_comm import MEASURE_HINT
from ..plan.launch import make_plan
from ..plan.longcontext import LONG_ROW_TOKENS, longest_record
from ..preset.schema import Preset
from .rules import Advice, Fix, make_context

TRUNCATED_MAX = 0.01  # of the records: more than this truncated is warned about
WASTE_MAX = 0.20  # of the tokens a step computes: more padding than this is warned about


def preview_command(preset: Preset, *, base_dir: str = ".", local_python: str | None = None,
                    bins: int = 16, longer_than: int | None = None) -> tuple[list[str], str]:
    """(argv, cwd) of the preview on the master: its python and workdir, the worker's flags from the plan."""
    plan = make_plan(preset, run_id="data-preview", local_run_dir=os.path.join(base_dir, ".data-preview"),
                     base_dir=base_dir, local_python=local_python or sys.executable)
    master = plan.nodes[0]
    at = master.argv.index("training.finetune")
    device = "cpu" if preset.training.device == "cpu" else "cuda"
    argv = [master.argv[0], "-m", "training.datapreview", "--world_size", str(plan.world_size),
            "--device", device, "--bins", str(bins)]
    if longer_than:
        argv += ["--longer_than", str(longer_than)]
    argv += ["--", *master.argv[at + 1:]]
    return [*master.container, *argv], master.workdir  # in the run's container where it has one


def tokens_per_second(preset: Preset, facts: ClusterFacts | None = None, *, gpu: str | None = None,
                      bandwidth_gbps: float | None = None, efficiency: float | None = None,
                      base_dir: str | None = None, nic_gbps: float | None = None) -> tuple[float | None, str]:
    """The estimate's tokens/s for this preset and where it comes from, or (None, why not). bandwidth_gbps: the
    per-node bus bandwidth between nodes; nic_gbps: the line rate of the one link between them, else."""
    c = make_context(preset, facts, gpu=gpu, bandwidth_gbps=bandwidth_gbps, efficiency=efficiency, base_dir=base_dir,
                     nic_gbps=nic_gbps, nics=1 if nic_gbps else None)
    if c.cpu:
        return None, "no speed estimate for CPU processes (the estimate models GPUs)"
    if c.spec is None:
        return None, f"no speed estimate: {c.spec_error}"
    if c.gpu is None:
        return None, "no speed estimate: GPU type unknown (pass --gpu, or probe the nodes)"
    if not c.speed_known:
        return None, "no speed estimate: link between nodes not measured (" + MEASURE_HINT + ")"
    step = c.step_here()
    where = f", {c.bandwidth.source} bandwidth between nodes" if c.nodes > 1 else ""
    return step.tokens_per_second, f"estimate on {c.gpu.name} GPUs{where}"


def trainable_limit(preset: Preset, facts: ClusterFacts | None = None, *, gpu: str | None = None,
                    base_dir: str | None = None) -> tuple[int | None, str]:
    """The longest record one GPU trains for this preset (qwen_tui.plan.longcontext) and on which GPU, or (None, why
    not): it needs the model's shape and the GPU's memory."""
    c = make_context(preset, facts, gpu=gpu, base_dir=base_dir)
    if c.cpu or c.spec is None or c.gpu_memory_gib is None:
        return None, "no GPU memory or model shape to estimate from"
    return longest_record(c.spec, preset.training, preset.world_size, c.gpu_memory_gib), c.gpu_memory_where


def build_report(counts: dict[str, Any], preset: Preset, tps: float | None, tps_source: str = "",
                 limit: int | None = None, limit_where: str = "") -> dict[str, Any]:
    """The counts with the timing (tokens per epoch at `tps`, stretched by the padding the batches carry), the
    longest record a GPU trains (`limit`, on `limit_where`) and the advice about the data."""
    r = dict(counts)
    r["longest_trainable"] = limit
    r["longest_trainable_where"] = limit_where if limit is not None else None
    r["supervised_share"] = round(r["supervised_tokens"] / r["tokens"], 4) if r["tokens"] else 0.0
    r["tokens_per_second"] = round(tps, 1) if tps else None
    r["tokens_per_second_source"] = tps_source
    waste = r.get("padding_waste") or 0.0
    if tps and r["steps_per_epoch"]:
        # The estimate's tokens/s are real tokens of full rows; padding is computed too, so it stretches the epoch.
        r["epoch_seconds"] = round(r["tokens_per_epoch"] / (tps * (1 - min(waste, 0.99))), 1)
        r["run_seconds"] = round(r["epoch_seconds"] * r["total_steps"] / r["steps_per_epoch"], 1)
    else:
        r["epoch_seconds"] = r["run_seconds"] = None
    r["advice"] = [a.to_dict() for a in data_advice(r, preset)]
    return r


def data_advice(r: dict[str, Any], preset: Preset) -> list[Advice]:
    out: list[Advice] = []
    t = preset.training
    if r["usable"] and r["steps_per_epoch"] == 0:
        out.append(Advice(Level.ERROR, "DATA_TOO_SMALL",
                          f"{r['usable']} usable records, fewer than one global batch of {r['global_batch_size']}: "
                          "the worker would stop before training",
                          Fix("lower the micro-batch", {"training.per_device_train_batch_size": 1,
                                                        "training.gradient_accumulation_steps": 1})))
    positions = r.get("max_positions")  # the model's own: no length is advised past them
    limit = r.get("longest_trainable")  # the longest row one GPU trains (where the GPU is known)

    def length_fix(want: int, why: str) -> Fix | None:
        caps = [(positions, "the model's positions"), (limit, "what one GPU trains")]
        cap, capped_by = min(((c, w) for c, w in caps if c), default=(None, ""))
        n = want if cap is None else min(want, cap)
        if n <= t.model_max_length:
            return None
        label = f"raise model_max_length to {why} ({n:,})" if n == want else \
            f"raise model_max_length to {n:,} ({capped_by}; {why} is {want:,})"
        return Fix(label, {"training.model_max_length": n})

    if r["records"] and r["truncated"] / r["records"] > TRUNCATED_MAX:
        p99 = r["length_percentiles"]["p99"]
        past = f"; the model has {positions:,} positions" if positions and p99 > positions else ""
        out.append(Advice(Level.WARNING, "DATA_TRUNCATED",
                          f"{r['truncated']} of {r['records']} records ({r['truncated'] / r['records']:.1%}) are longer "
                          f"than model_max_length {t.model_max_length} and get cut; p99 is {p99} tokens{past}",
                          length_fix(p99, "the p99")))
    if r["dropped"]:
        out.append(Advice(Level.WARNING, "DATA_DROPPED",
                          f"{r['dropped']} record(s) have no assistant token left after the cut and are skipped",
                          length_fix(r["length_percentiles"]["max"], "the longest record")))
    over = r.get("longer_than")
    if over and over["records"]:
        n, lim = over["records"], over["tokens"]
        sp = t.sequence_parallel_size
        where = r.get("longest_trainable_where") or "the GPU"
        out.append(Advice(Level.ERROR, "DATA_TOO_LONG_FOR_GPU",
                          f"{n} record(s) are longer than the {lim:,} tokens one GPU trains ({where}"
                          f"{f', {sp} GPUs a row' if sp > 1 else ''}); the longest has {over['longest']:,}: its row "
                          "would run out of memory",
                          Fix(f"model_max_length {lim:,} (cuts them)", {"training.model_max_length": lim},
                              hint="or spread each row over more GPUs: training.sequence_parallel_size")))
    waste = r.get("padding_waste")
    if waste is not None and waste > WASTE_MAX:
        if r.get("packing"):
            fix = Fix("fewer, fuller rows", hint="the steps are too small to fill the packed rows: raise "
                      "gradient_accumulation_steps or lower per_device_train_batch_size")
        else:
            fix = Fix("pack the records", hint="drop --no_packing from training.extra_args")
        out.append(Advice(Level.WARNING, "DATA_PADDING",
                          f"{waste:.0%} of the tokens each step computes would be padding "
                          f"({'packed rows' if r.get('packing') else 'micro-batches padded to their longest record'})",
                          fix))
    return out


# ------------------------------------------------------------------ text (CLI and the wizard's panel)

def histogram_lines(hist: dict[str, Any], width: int = 40, max_length: int | None = None) -> list[str]:
    """One bar per bin, scaled to the fullest; bins past `max_length` (cut by the worker) are marked."""
    edges, counts = hist["edges"], hist["counts"]
    top = max(counts) or 1
    label_w = len(f"{edges[-2]}-{edges[-1] - 1}")
    out = []
    for i, n in enumerate(counts):
        lo, hi = edges[i], edges[i + 1] - 1
        bar = "█" * round(n / top * width) if n else ""
        if n and not bar:
            bar = "▏"
        # a bin wholly past the cut is cut; one the cut runs through holds records on both sides of it
        cut = "" if max_length is None or not n or hi <= max_length else "  (cut)" if lo > max_length \
            else "  (partly cut)"
        out.append(f"{f'{lo}-{hi}':>{label_w}} │{bar:<{width}} {n}{cut}")
    return out


def _duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def summary_lines(r: dict[str, Any]) -> list[str]:
    """The report as plain text lines (no markup)."""
    p = r["length_percentiles"]
    lines = [
        f"records {r['records']:,}: {r['usable']:,} usable, {r['dropped']:,} dropped, {r['truncated']:,} truncated "
        f"(model_max_length {r['model_max_length']:,})",
        f"tokens {r['tokens']:,}, {r['supervised_tokens']:,} supervised ({r['supervised_share']:.1%})",
        f"length p50 {p['p50']:,}  p90 {p['p90']:,}  p99 {p['p99']:,}  max {p['max']:,}",
        f"epoch: {r['steps_per_epoch']:,} steps of {r['global_batch_size']:,} {'pairs' if r.get('pairs') else 'records'}, {r['tokens_per_epoch']:,} tokens; "
        f"run: {r['total_steps']:,} steps",
    ]
    if r.get("pairs"):
        lines.insert(0, f"DPO: {r['pairs']:,} preference pairs, counted below as their chosen and rejected "
                        "conversations")
    tools = r.get("tools") or {}
    if tools.get("records_with_tools"):
        lines.append(f"tools: {tools['records_with_tools']:,} records with tools, {tools['tool_calls']:,} calls "
                     f"({tools['call_tokens']:,} tokens, trained on), {tools['tool_results']:,} results "
                     f"({tools['result_tokens']:,} tokens, not trained on)")
    for src in r.get("sources") or []:
        lines.append(f"source {src['name']} ({src['format']}): {src['records']:,} of {src['available']:,} records"
                     f"{' (repeated)' if src.get('repeated') else ''}, {src.get('share_records', 0):.1%} of the "
                     f"records, {src.get('share_tokens', 0):.1%} of the tokens")
    waste = r.get("padding_waste")
    if waste is not None:
        lines.append(f"padding {waste:.1%} of computed tokens ({'packed rows' if r.get('packing') else 'padded batches'})")
    over, lim = r.get("longer_than"), r.get("longest_trainable")
    if lim is not None and over and (over["records"] or over["longest"] >= LONG_ROW_TOKENS):
        lines.append(f"longest record one GPU trains: {lim:,} tokens ({r['longest_trainable_where']}); "
                     f"{over['records']:,} longer, the longest has {over['longest']:,}")
    if r["epoch_seconds"] is not None:
        lines.append(f"time: {_duration(r['epoch_seconds'])} an epoch, {_duration(r['run_seconds'])} the run at "
                     f"{r['tokens_per_second']:,.0f} tokens/s ({r['tokens_per_second_source']})")
    else:
        lines.append(f"time: unknown ({r['tokens_per_second_source'] or 'no tokens/s'})")
    return lines
