"""Long multi-turn records for the long-context and sequence-parallel tests: each longer than half of a row of
MAX_LEN tokens, so no two share a row (and under sequence parallelism each is cut between the ranks); the worker's
flags for them, and the one-process run both folders compare with (the `long_files` and `long_one` fixtures,
tests/training/conftest.py)."""

from __future__ import annotations

from pathlib import Path

from support.worker import demo_records, write_jsonl

MAX_LEN = 640
STEPS = 6


def write_long_records(d: Path, tiny_model: Path) -> dict[str, str]:
    """Records of 10 demo conversations each, written under `d`: {"model": the tiny model, "train": the file}."""
    recs = demo_records()
    long = []
    for i in range(0, 320, 10):
        conv = [recs[i]["conversations"][0]]
        for r in recs[i:i + 10]:
            conv += [t for t in r["conversations"] if t["from"] != "system"]
        long.append({"id": f"long-{i // 10:02d}", "conversations": conv})
    return {"model": str(tiny_model), "train": str(write_jsonl(d / "long.jsonl", long))}


def record_lengths(files) -> list[int]:
    from transformers import AutoTokenizer

    from training.data.batches import build_dataset
    from training.data.encoding import ChatEncoder
    from training.data.records import load_conversations

    tok = AutoTokenizer.from_pretrained(files["model"])
    return [len(e.input_ids) for e in build_dataset(load_conversations(files["train"]), ChatEncoder(tok, MAX_LEN),
                                                        lazy=False).items]


def flags(files, *extra):
    # Full fine-tuning without dropout: the one-process and two-process runs draw no random numbers in a step.
    return ["--model_name_or_path", files["model"], "--data_path", files["train"], "--model_max_length", str(MAX_LEN),
            "--packing_tokens", str(MAX_LEN), "--per_device_train_batch_size", "1", "--gradient_accumulation_steps",
            "2", "--learning_rate", "1e-3", "--max_steps", str(STEPS), "--save_strategy", "no", "--seed", "7",
            "--eval_data_path", files["train"], "--per_device_eval_batch_size", "4", *extra]
