"""A tiny Qwen2 model and tokenizer, built offline in about a second (and two tiny mixture-of-experts ones).

    python -m training.tiny OUT_DIR [KIND]   # build (idempotent); KIND qwen2 (default), qwen3_moe or qwen2_moe
    --model_name_or_path builtin:tiny        # the worker builds it on first use
    --model_name_or_path builtin:tiny-moe    # Qwen3-MoE: 8 experts, 2 a token, no shared expert
    --model_name_or_path builtin:tiny-qwen2-moe   # Qwen2-MoE: 8 experts, 2 a token, plus a gated shared expert

It is what the local demo and the tests train: hidden 64, 2 layers, 4 heads
(2 KV heads), a byte-level BPE of at most 1k tokens (750 today) trained on the demo chat data with
Qwen's own pre-tokenizer regex, `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`
as the last ids, and Qwen2's ChatML chat template. It loads with the Auto
classes under HF_HUB_OFFLINE=1 like any Qwen2 checkpoint. The build is
deterministic: same seed, same corpus, same bytes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

BUILTIN_TINY = "builtin:tiny"
# builtin name -> architecture of the tiny model (the MoE ones share the tokenizer and the attention shape)
BUILTINS = {"builtin:tiny": "qwen2", "builtin:tiny-moe": "qwen3_moe", "builtin:tiny-qwen2-moe": "qwen2_moe"}
VOCAB_SIZE = 1024  # BPE vocabulary including the 3 special tokens
SEED = 1234
LM_HEAD_STD = 0.2
# Qwen2's pre-tokenizer split (the same regex as the real vocabulary).
QWEN_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2-Instruct's chat template, verbatim.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
BUILD_WAIT_S = 300  # how long a non-building process waits for another one's build


def _corpus() -> list[str]:
    """Texts the BPE learns its merges from: the demo chat data, rendered as ChatML."""
    from training.demo_data.make_demo_chat import build

    texts = []
    for rec in build():
        texts.append(
            "".join(f"<|im_start|>{t['from']}\n{t['value']}<|im_end|>\n" for t in rec["conversations"])
        )
    return texts


def _build_tokenizer(out: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        special_tokens=[],
    )
    # Strip the markup so merges are learnt on text; the specials are added after.
    texts = [t.replace("<|im_start|>", "").replace("<|im_end|>", "") for t in _corpus()]
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)  # appended: they become the last ids, as in Qwen
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=32768,
        padding_side="right",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


MOE_SHAPE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                 router_aux_loss_coef=0.001, decoder_sparse_step=1, output_router_logits=False)


def _config(kind: str, **common):
    """The tiny config of an architecture: the dense model's attention and vocabulary for all three."""
    if kind == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(intermediate_size=128, tie_word_embeddings=False, **common)  # untied as in Qwen2.5-7B
    if kind == "qwen3_moe":  # like Qwen3-30B-A3B: top-k probabilities renormalised, untied head, no q/k/v bias
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(intermediate_size=128, head_dim=16, tie_word_embeddings=False, **MOE_SHAPE, **common)
    if kind == "qwen2_moe":  # like Qwen2-57B-A14B: a shared expert beside the routed ones, q/k/v biases
        from transformers import Qwen2MoeConfig

        shape = {**MOE_SHAPE, "norm_topk_prob": False}
        return Qwen2MoeConfig(intermediate_size=128, shared_expert_intermediate_size=64, tie_word_embeddings=False,
                              **shape, **common)
    raise ValueError(f"unknown tiny model kind {kind!r}; known: {', '.join(sorted(set(BUILTINS.values())))}")


def _build_model(out: Path, vocab_size: int, eos_id: int, pad_id: int, kind: str = "qwen2") -> None:
    import torch
    from transformers import AutoModelForCausalLM

    config = _config(
        kind,
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        rope_theta=10000.0,
        use_cache=True,
    )
    torch.manual_seed(SEED)
    if kind == "qwen2":
        from transformers import Qwen2ForCausalLM

        model = Qwen2ForCausalLM(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        # With every weight at std 0.02 the logits of a 64-wide model can barely move unless the
        # output layer itself trains, so LoRA (which freezes it) would hardly lower the loss. A
        # wider output layer gives the adapters logits they can steer: the demo then learns visibly.
        model.lm_head.weight.normal_(0.0, LM_HEAD_STD)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    model.save_pretrained(out)


def build_tiny(out_dir: str | os.PathLike, kind: str = "qwen2") -> Path:
    """Builds the tiny model into out_dir unless a complete one is already there.

    Writes into a temporary sibling directory and renames it into place, so a
    reader never sees a half-built model and concurrent builders (several
    nodes on one shared home) cannot corrupt each other: the first rename wins,
    the others discard their copy.
    """
    out = Path(out_dir)
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared by several users' jobs
    try:
        _build_tokenizer(tmp)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tmp)
        _build_model(tmp, len(tok), tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id, kind)
        (tmp / "BUILT_BY").write_text(f"training.tiny: tiny offline {kind} for tests and the demo\n")
        if out.exists() and not any(out.iterdir()):
            out.rmdir()  # an empty target (e.g. made by mkdtemp in a test) is ours to fill
        try:
            os.rename(tmp, out)
        except OSError:
            # Someone else renamed a complete build into place first: use theirs.
            if not (out / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def default_cache_dir(kind: str = "qwen2") -> Path:
    from training.runtime.cachedir import cache_root

    return cache_root() / ("tiny-qwen2" if kind == "qwen2" else f"tiny-{kind.replace('_', '-')}")


def ensure_builtin_tiny(local_rank: int, name: str = BUILTIN_TINY) -> Path:
    """Resolves `builtin:tiny` (or another of BUILTINS): local rank 0 builds it, the other ranks wait for the
    rename."""
    kind = BUILTINS[name]
    out = default_cache_dir(kind)
    if local_rank == 0:
        return build_tiny(out, kind)
    deadline = time.monotonic() + BUILD_WAIT_S
    while not (out / "config.json").is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {BUILD_WAIT_S}s for local rank 0 to build the tiny model in {out}")
        time.sleep(0.2)
    return out
