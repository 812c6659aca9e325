"""Data: both record formats, assistant-only labels (tiny and real Qwen vocabularies), truncation, data order."""

from __future__ import annotations

import json

import pytest

from support.worker import demo_records, write_jsonl
from training.data.batches import Collator, StepSampler, build_dataset, eval_batches
from training.data.encoding import IGNORE_INDEX, ChatEncoder
from training.data.records import load_conversations
from training.runtime.errors import InputError

# Qwen2.5-Instruct's behaviour without tools: a default system prompt when none is given, ChatML turns.
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3's quirk: the last assistant turn gets an (empty) thinking block, earlier ones do not.
QWEN3_LIKE_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and loop.last %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CHAT = {
    "id": "multi-1",
    "conversations": [
        {"from": "system", "value": "You are a terse assistant. Réponds en français si besoin."},
        {"from": "user", "value": "Say hello in Japanese."},
        {"from": "assistant", "value": "こんにちは (konnichiwa) 👋"},
        {"from": "user", "value": "And 2+2?\nAnswer with a number."},
        {"from": "assistant", "value": "4"},
        {"from": "user", "value": "Thanks — ¿y en español?"},
        {"from": "assistant", "value": "¡Hola! Cuatro.\n\nDe nada."},
    ],
}


def labelled_runs(ids, labels):
    """Maximal runs of consecutive labelled positions, as (start, token ids)."""
    runs, cur, start = [], [], None
    for i, (t, lab) in enumerate(zip(ids, labels)):
        if lab != IGNORE_INDEX:
            assert lab == t, "a label must be the token itself"
            if not cur:
                start = i
            cur.append(t)
        elif cur:
            runs.append((start, cur))
            cur = []
    if cur:
        runs.append((start, cur))
    return runs


def conv(tmp_path, rec=CHAT):
    return load_conversations(str(write_jsonl(tmp_path / "d.jsonl", [rec])))[0]


def test_real_qwen_vocab_labels_exactly_assistant_content_and_end_of_turn(tmp_path, qwen_tokenizer):
    tok = qwen_tokenizer
    tok.chat_template = QWEN25_TEMPLATE
    c = conv(tmp_path)
    enc = ChatEncoder(tok, 4096).encode(c)
    runs = labelled_runs(enc.input_ids, enc.labels)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    header = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    replies = [m["content"] for m in c.messages if m["role"] == "assistant"]
    assert len(runs) == len(replies) == 3
    for (start, toks), reply in zip(runs, replies):
        # exactly the reply's own tokens, then <|im_end|>; the header right before is unlabelled
        assert toks == tok(reply, add_special_tokens=False)["input_ids"] + [im_end]
        assert enc.input_ids[start - len(header):start] == header
        assert tok.decode(toks) == reply + "<|im_end|>"
    # everything else (system prompt, user turns, headers, newlines) is masked
    n_labelled = sum(lab != IGNORE_INDEX for lab in enc.labels)
    assert n_labelled == sum(len(t) for _, t in runs)
    assert tok.decode(enc.input_ids) == tok.apply_chat_template(list(c.messages), tokenize=False)


def test_real_qwen_vocab_default_system_prompt_is_masked(tmp_path, qwen_tokenizer):
    tok = qwen_tokenizer
    tok.chat_template = QWEN25_TEMPLATE
    rec = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
    enc = ChatEncoder(tok, 4096).encode(conv(tmp_path, rec))
    assert "You are Qwen" in tok.decode(enc.input_ids)
    assert tok.decode([t for t, lab in zip(enc.input_ids, enc.labels) if lab != IGNORE_INDEX]) == "Hello!<|im_end|>"


def test_template_that_rewrites_the_last_turn(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = QWEN3_LIKE_TEMPLATE
    enc = ChatEncoder(tok, 4096).encode(conv(tmp_path))
    runs = [tok.decode(t) for _, t in labelled_runs(enc.input_ids, enc.labels)]
    assert runs == ["こんにちは (konnichiwa) 👋<|im_end|>", "4<|im_end|>",
                    "<think>\n\n</think>\n\n¡Hola! Cuatro.\n\nDe nada.<|im_end|>"]


def test_short_replies_that_also_occur_in_the_markup(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    rec = {"messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "Say a"},
                        {"role": "assistant", "content": "a"}, {"role": "user", "content": "assistant"},
                        {"role": "assistant", "content": "assistant"}]}
    enc = ChatEncoder(tok, 4096).encode(conv(tmp_path, rec))
    runs = [tok.decode(t) for _, t in labelled_runs(enc.input_ids, enc.labels)]
    assert runs == ["a<|im_end|>", "assistant<|im_end|>"]


def test_both_formats_give_the_same_tokens(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    openai = {"id": "multi-1", "messages": [{"role": t["from"], "content": t["value"]} for t in CHAT["conversations"]]}
    encoder = ChatEncoder(tok, 4096)
    a, b = encoder.encode(conv(tmp_path, CHAT)), encoder.encode(conv(tmp_path, openai))
    assert a.input_ids == b.input_ids and a.labels == b.labels
    assert sum(lab != IGNORE_INDEX for lab in a.labels) > 10


def test_json_array_file_and_sharegpt_role_names(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(json.dumps([{"id": 7, "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}]))
    (c,) = load_conversations(str(p))
    assert c.id == "7" and [m["role"] for m in c.messages] == ["user", "assistant"]


def test_truncation_is_counted_and_unlearnable_records_dropped(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    long_reply = {"id": "long", "messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "word " * 200}]}
    long_prompt = {"id": "long-prompt", "messages": [{"role": "user", "content": "word " * 200},
                                                     {"role": "assistant", "content": "ok"}]}
    short = {"id": "short", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    convs = load_conversations(str(write_jsonl(tmp_path / "d.jsonl", [long_reply, long_prompt, short])))
    ds = build_dataset(convs, ChatEncoder(tok, 64), lazy=False)
    assert ds.stats.truncated == 2 and ds.stats.truncated_ids == ["long", "long-prompt"]
    assert ds.stats.dropped == 1  # the long prompt left no assistant token within 64
    assert len(ds) == 2 and all(len(e.input_ids) <= 64 for e in ds.items)
    lazy = build_dataset(convs, ChatEncoder(tok, 64), lazy=True)
    assert [lazy[0].input_ids, lazy[0].labels] == [ds[0].input_ids, ds[0].labels] and lazy[0].truncated
    batch = Collator(tok.pad_token_id)([lazy[0], lazy[2]])
    assert int(batch["truncated"]) == 1


def test_collator_pads_to_the_batch_not_the_max_length(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    convs = load_conversations(str(write_jsonl(tmp_path / "d.jsonl", demo_records(4))))
    ds = build_dataset(convs, ChatEncoder(tok, 8192), lazy=False)
    b = Collator(tok.pad_token_id)([ds[i] for i in range(4)])
    longest = max(len(ds[i].input_ids) for i in range(4))
    assert b["input_ids"].shape == (4, longest) < (4, 8192)
    for i in range(4):
        n = len(ds[i].input_ids)
        assert b["attention_mask"][i].sum() == n
        assert (b["labels"][i, n:] == IGNORE_INDEX).all() and (b["input_ids"][i, n:] == tok.pad_token_id).all()


def test_data_order_is_global_and_resumable():
    kw = dict(n_records=100, accumulation=2, seed=3, total_steps=12)
    one = list(StepSampler(world_size=1, rank=0, micro_batch=4, **kw))
    two = [list(StepSampler(world_size=2, rank=r, micro_batch=2, **kw)) for r in range(2)]
    # Each optimizer step covers the same 8 records whatever the number of processes...
    for step in range(12):
        global_one = set(one[2 * step] + one[2 * step + 1])
        global_two = set(sum((two[r][2 * step + m] for r in range(2) for m in range(2)), []))
        assert global_one == global_two and len(global_two) == 8
    # ...ranks never share a record within an epoch (12 steps x 8 < 100 records: one epoch)...
    seen = [i for r in range(2) for mb in two[r] for i in mb]
    assert len(seen) == len(set(seen)) == 96
    # ...the next epoch is a different order...
    nxt = list(StepSampler(world_size=1, rank=0, micro_batch=4, n_records=100, accumulation=2, seed=3,
                           total_steps=24, start_step=12))
    assert nxt[:2] != one[:2]
    # ...and a sampler started at step 5 yields exactly the rest.
    assert list(StepSampler(world_size=2, rank=1, micro_batch=2, start_step=5, **kw)) == two[1][10:]


def test_eval_batches_are_equal_in_number_on_every_rank():
    per_rank = [eval_batches(5, 2, r, 2) for r in range(2)]
    assert [len(b) for b in per_rank] == [2, 2]
    assert sorted(i for b in per_rank for mb in b for i in mb) == [0, 1, 2, 3, 4]


BAD = [
    ('{"conversations": [{"from": "user", "value": "q"}, {"from": "assistant", "value": "a"}]}\n{"id": "x", oops}\n',
     ["d.jsonl:2", "invalid JSON"]),
    ('{"id": "r0", "conversations": [{"from": "user", "value": "q"}]}\n', ["record 0", "'r0'", "no assistant turn"]),
    ('{"id": "r0", "conversations": [{"from": "user", "value": "q"}, {"from": "assistant", "value": "a"}]}\n'
     '{"id": "r1", "conversations": [{"from": "robot", "value": "q"}, {"from": "assistant", "value": "a"}]}\n',
     ["d.jsonl:2", "record 1", "'r1'", "unknown role 'robot'"]),
    ('{"id": "e", "messages": []}\n', ["record 0", "'e'", "empty conversation"]),
    ('{"id": "n", "text": "hello"}\n', ["record 0", "neither 'conversations'"]),
    ('{"id": "s", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [1]}]}\n',
     ["'s'", "messages[1].content must be a string"]),
    ('[{"id": "a", "messages": [{"role": "user", "content": "q"},\n  {"role": "assistant" "content": "a"}]}]',
     ["d.jsonl", "line 2", "invalid JSON"]),
]


@pytest.mark.parametrize("text,expected", BAD, ids=["json", "no-assistant", "role", "empty", "format", "content", "array"])
def test_bad_records_name_file_record_and_problem(tmp_path, text, expected):
    p = tmp_path / "d.jsonl"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as e:
        load_conversations(str(p))
    for part in expected:
        assert part in str(e.value), str(e.value)
