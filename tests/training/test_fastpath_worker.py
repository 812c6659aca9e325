"""The fast path through the worker itself (`python -m training.finetune`), on CPU with the tiny model.

On CPU the automatic choice is packing (per-record attention) + the chunked cross-entropy; these runs
are compared with the plain path (`--no_packing --fused_ce off`: padded micro-batches, transformers'
own loss) on the same data with the same seed: the loss curves must match step by step and both
must fall, and metrics.jsonl must count the same real tokens (no padding) in both, equal to the
lengths of the records the sampler chose. Over torchrun with 2 processes, small packed rows give the
ranks different numbers of rows, so the worker pads with empty rows; the curve must still be the
single-process one and the replicas must end identical.
"""

from __future__ import annotations

import pytest

from support.worker import assert_ok, demo_records, run_worker, write_jsonl

pytestmark = pytest.mark.slow

STEPS = 40
PLAIN = ["--no_packing", "--fused_ce", "off"]


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model):
    d = tmp_path_factory.mktemp("fdata")
    return {"model": str(tiny_model), "train": str(write_jsonl(d / "train.jsonl", demo_records()))}


def flags(files, *extra):
    # Full fine-tuning without dropout: both paths draw no random numbers during the step.
    return ["--model_name_or_path", files["model"], "--data_path", files["train"], "--model_max_length", "128",
            "--learning_rate", "1e-3", "--max_steps", str(STEPS), "--save_strategy", "no", "--logging_steps", "1",
            "--warmup_ratio", "0.05", "--seed", "7", *extra]


@pytest.fixture(scope="module")
def plain(tmp_path_factory, files):
    run = run_worker(tmp_path_factory.mktemp("plain") / "out", *flags(files, "--per_device_train_batch_size", "8"), *PLAIN)
    assert_ok(run)
    return run


def real_tokens_per_step(files, world: int, mb: int, gas: int) -> list[tuple[int, int]]:
    """(tokens, supervised tokens) of every step, from the data and the sampler, independently of the loop."""
    from transformers import AutoTokenizer

    from training.data.batches import StepSampler, build_dataset
    from training.data.encoding import ChatEncoder
    from training.data.records import load_conversations

    ds = build_dataset(load_conversations(files["train"]), ChatEncoder(AutoTokenizer.from_pretrained(files["model"]), 128),
                       lazy=False)
    per_rank = [list(StepSampler(len(ds), world, r, mb, gas, 7, STEPS)) for r in range(world)]
    out = []
    for step in range(STEPS):
        recs = [ds[i] for r in range(world) for b in per_rank[r][step * gas:(step + 1) * gas] for i in b]
        out.append((sum(len(e.input_ids) for e in recs), sum(1 for e in recs for x in e.labels[1:] if x != -100)))
    return out


def falls(losses, by):
    return sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - by


def assert_same_curve(got, ref, rel):
    assert [r["step"] for r in got] == [r["step"] for r in ref] == list(range(1, STEPS + 1))
    for a, b in zip(got, ref):
        assert a["loss"] == pytest.approx(b["loss"], rel=rel), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=10 * rel), (a, b)
        assert a["tokens"] == b["tokens"] and a["label_tokens"] == b["label_tokens"], (a, b)


def test_fast_path_in_one_process_matches_the_plain_path(tmp_path, files, plain):
    # 4 records x 2 accumulation = the plain run's 8 records a step; packing merges them into rows of 512 tokens.
    fast = run_worker(tmp_path / "out", *flags(files, "--per_device_train_batch_size", "4",
                                               "--gradient_accumulation_steps", "2"))
    assert_ok(fast)
    fp = fast.records[0]["fast_path"]
    assert fp["packing"] is True and fp["ce"] == "chunked" and fp["packing_tokens"] == 4 * 128
    assert fp["compile"] is False and fp["fused_adamw"] is False and fp["auto_micro_batch"] is False
    assert "per-record attention on CPU" in fp["why"]["packing"] and "fast path: packing on" in fast.stderr
    pp = plain.records[0]["fast_path"]
    assert pp["packing"] is False and pp["ce"] == "hf"
    assert_same_curve(fast.steps, plain.steps, rel=2e-4)
    for run in (fast, plain):
        assert falls([r["loss"] for r in run.steps], 1.0), [r["loss"] for r in run.steps]
    # Real tokens: the records' own lengths, no padding, in both runs.
    want = real_tokens_per_step(files, 1, 8, 1)
    assert [(r["tokens"], r["label_tokens"]) for r in plain.steps] == want
    # Packing merges a step's 2 accumulation micro-batches: mostly into one row of 512 tokens.
    rows = [r["micro_batches"] for r in fast.steps]
    assert all(n in (1, 2) for n in rows) and sum(rows) < 2 * STEPS, rows
    assert all(r["empty_rows"] == 0 for r in fast.steps)
    assert "micro_batches" not in plain.steps[0]


def test_lora_inputs_in_bf16_keep_the_loss_curve(tmp_path, files):
    """--no_lora_input_cast (the CUDA default under autocast) against peft's own fp32 cast, LoRA with dropout
    under bf16 autocast: the dropout masks are drawn from a tensor of another dtype (and on CPU the bf16 dropout
    rounds its 1/(1-p) scale), so the curves are close, not equal."""
    lora = ["--use_lora", "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0.1", "--bf16",
            "--per_device_train_batch_size", "8"]
    ref = run_worker(tmp_path / "cast", *flags(files, *lora, "--lora_input_cast"))
    bf16 = run_worker(tmp_path / "bf16", *flags(files, *lora, "--no_lora_input_cast"))
    assert_ok(ref)
    assert_ok(bf16)
    assert ref.records[0]["fast_path"]["lora_input_cast"] is True
    assert bf16.records[0]["fast_path"]["lora_input_cast"] is False
    for a, b in zip(bf16.steps, ref.steps, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-2), (a, b)
        assert a["tokens"] == b["tokens"]
    for run in (ref, bf16):
        assert falls([r["loss"] for r in run.steps], 0.5), [r["loss"] for r in run.steps]


def test_fast_path_over_torchrun_pads_ranks_to_the_same_rows(tmp_path, files, plain):
    # Rows of 128 tokens hold one or two records: the ranks need different numbers of rows.
    ddp = run_worker(tmp_path / "fast", *flags(files, "--per_device_train_batch_size", "4", "--packing_tokens", "128"),
                     nproc=2)
    assert_ok(ddp)
    start, end = ddp.records[0], ddp.records[-1]
    assert start["world_size"] == 2 and start["fast_path"]["packing"] is True
    assert start["fast_path"]["packing_tokens"] == 128
    assert end["replicas_in_sync"] is True and len(end["replica_checksums"]) == 2
    assert sum(r["empty_rows"] for r in ddp.steps) > 0, "no step needed empty rows: the test shows nothing"
    assert_same_curve(ddp.steps, plain.steps, rel=2e-4)
    assert [(r["tokens"], r["label_tokens"]) for r in ddp.steps] == real_tokens_per_step(files, 2, 4, 1)
    ddp_plain = run_worker(tmp_path / "plain", *flags(files, "--per_device_train_batch_size", "4"), *PLAIN, nproc=2)
    assert_ok(ddp_plain)
    assert ddp_plain.records[-1]["replicas_in_sync"] is True
    assert_same_curve(ddp_plain.steps, plain.steps, rel=2e-4)
    assert falls([r["loss"] for r in ddp.steps], 1.0)


@pytest.mark.parametrize("extra,message", [
    (["--deepspeed", "builtin:zero3", "--auto_micro_batch"], "--auto_micro_batch measures CUDA memory"),
    (["--fused_ce", "liger"], "--fused_ce liger needs a CUDA GPU"),
    (["--auto_micro_batch"], "--auto_micro_batch measures CUDA memory"),
    (["--no_packing", "--packing_tokens", "512"], "they need packing"),
    (["--packing_tokens", "64"], "less than --model_max_length"),
    (["--attention_kernel", "cudnn"], "--attention_kernel cudnn needs a CUDA GPU of compute capability 9.0"),
    (["--fused_lora_dropout"], "--fused_lora_dropout fuses LoRA's dropout: it needs --use_lora"),
    (["--use_lora", "--fused_lora_dropout"], "--fused_lora_dropout runs a Triton kernel: it needs a CUDA GPU"),
    (["--profile_trace"], "--profile_trace writes the trace of --profile_step N"),
    (["--no_packing", "--labelled_logits_only"], "--labelled_logits_only selects a packed row's supervised positions"),
])
def test_impossible_fast_path_choices_exit_2(tmp_path, files, extra, message):
    run = run_worker(tmp_path / "out", *flags(files, *extra))
    assert run.rc == 2, run.stderr[-2000:]
    assert message in run.stderr and not (tmp_path / "out").exists()


def test_help_documents_every_fast_path_flag():
    from training.args import build_parser

    text = build_parser().format_help()
    for flag in ("--packing", "--no_packing", "--packing_tokens", "--fused_ce", "--compile", "--no_compile",
                 "--fused_adamw", "--no_fused_adamw", "--auto_micro_batch", "--no_auto_micro_batch",
                 "--auto_memory_fraction", "--auto_max_tokens", "--random_init", "--lora_input_cast",
                 "--no_lora_input_cast", "--profile_step", "--attention_kernel", "--profile_trace",
                 "--overlap_steps", "--no_overlap_steps", "--expandable_segments", "--no_expandable_segments",
                 "--fused_lora_dropout", "--no_fused_lora_dropout", "--labelled_logits_only", "--no_labelled_logits_only"):
        assert flag in text, flag
    assert "{auto,liger,chunked,off}" in text
    assert "{auto,flash,cudnn}" in text


def test_expandable_segments_flag_that_contradicts_the_environment_exits_2(tmp_path, files, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64,expandable_segments:False")
    run = run_worker(tmp_path / "out", *flags(files, "--expandable_segments"))
    assert run.rc == 2, run.stderr[-2000:]
    assert "--expandable_segments contradicts PYTORCH_CUDA_ALLOC_CONF" in run.stderr
    assert not (tmp_path / "out").exists()


def test_overlapped_steps_log_the_same_numbers_around_evals_checkpoints_and_a_profiled_step(tmp_path, files):
    """--overlap_steps (the CUDA default) reads each step back once the next one is queued; steps with an
    evaluation, a checkpoint or the profiler, and the last one, are read back at once. The records must be the
    ones the step-by-step loop writes, in the same order, with evaluations and checkpoints after their step."""
    import gzip
    import json

    common = flags(files, "--use_lora", "--lora_r", "8", "--lora_dropout", "0.1", "--per_device_train_batch_size",
                   "4", "--max_steps", "16", "--logging_steps", "3", "--eval_data_path", files["train"],
                   "--eval_steps", "5", "--save_strategy", "steps", "--save_steps", "7", "--profile_step", "9",
                   "--profile_trace")
    runs = {}
    for mode in ("--overlap_steps", "--no_overlap_steps"):
        run = run_worker(tmp_path / mode.strip("-"), *common, mode)
        assert_ok(run)
        runs[mode] = run
    ov, seq = runs["--overlap_steps"], runs["--no_overlap_steps"]
    assert ov.records[0]["fast_path"]["overlap_steps"] is True and seq.records[0]["fast_path"]["overlap_steps"] is False

    def shape(run):
        out = []
        for r in run.records:
            if "event" not in r:
                out.append(("step", r["step"], r["loss"], r["grad_norm"], r["tokens"], r["label_tokens"]))
            elif r["event"] in ("eval", "checkpoint"):
                out.append((r["event"], r["step"], r.get("eval_loss")))
        return out

    assert shape(ov) == shape(seq)
    kinds = [x[:2] for x in shape(ov)]
    # Logged every 3 steps and at the end; evaluations at 5, 10, 15 and checkpoints at 7, 14, each after its step's
    # training (the record of a window that ends later comes later).
    assert [k[1] for k in kinds if k[0] == "step"] == [3, 6, 9, 12, 15, 16]
    assert [k[1] for k in kinds if k[0] == "eval"][:3] == [5, 10, 15]
    assert [k[1] for k in kinds if k[0] == "checkpoint"] == [7, 14]
    assert kinds.index(("eval", 5)) < kinds.index(("step", 6)) and kinds.index(("checkpoint", 7)) < kinds.index(("step", 9))
    # The profiled step wrote its table and a Chrome trace with the loop's phase labels.
    out = ov.out
    assert (out / "profile-step9.txt").is_file()
    with gzip.open(out / "profile-step9.json.gz", "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {"step: inputs", "step: forward", "step: backward", "step: optimizer"} <= names


def test_overlapped_steps_over_torchrun_give_the_step_by_step_records(tmp_path, files):
    """Two processes, packed (the packing thread all-gathers row and token counts over its own gloo group) and
    overlapped, as on GPUs: the same records as reading every step back at once, replicas in step."""
    common = flags(files, "--use_lora", "--lora_r", "8", "--per_device_train_batch_size", "4", "--packing_tokens",
                   "128", "--max_steps", "10", "--logging_steps", "2")
    ov = run_worker(tmp_path / "ov", *common, "--overlap_steps", nproc=2)
    seq = run_worker(tmp_path / "seq", *common, "--no_overlap_steps", nproc=2)
    for run in (ov, seq):
        assert_ok(run)
        assert run.records[-1]["replicas_in_sync"] is True
    assert ov.records[0]["fast_path"]["overlap_steps"] is True
    keys = ("step", "loss", "grad_norm", "tokens", "label_tokens", "micro_batches", "empty_rows")
    assert [[r[k] for k in keys] for r in ov.steps] == [[r[k] for k in keys] for r in seq.steps]
    assert [r["step"] for r in ov.steps] == [2, 4, 6, 8, 10]
