"""Tool-call records in the forms users bring, rendered by Qwen2.5's and Qwen3's own chat templates.

The labels the worker's encoder gives are compared token by token with the template's own account of what the
assistant writes: the same template with `{% generation %}` around the assistant's part (tests/fixtures/
chat_templates/*-generation-marked.jinja, which must render exactly the same text), through transformers'
`return_assistant_tokens_mask`. Tool results and the tools' schemas are never labelled; a bad tool turn is
refused naming the record and the turn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.worker import write_jsonl
from training.data.encoding import IGNORE_INDEX, ChatEncoder
from training.data.records import load_conversations
from training.runtime.errors import InputError

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "chat_templates"
WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CLOCK = {"name": "get_time", "description": "Local time of a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
RESULT = '{"temp_c": 21, "sky": "clear skies"}'
TIME = '{"time": "14:05"}'
ANSWER = "It is 21 degrees with clear skies in Paris, and 14:05."

# One conversation (a question, two parallel calls, their results, the answer, a follow-up and a last call) in
# each form users have. Every form must come out as the same messages.
OPENAI = {"id": "openai", "tools": [{"type": "function", "function": WEATHER}, {"type": "function", "function": CLOCK}],
          "messages": [
              {"role": "system", "content": "You help travellers."},
              {"role": "user", "content": "Weather and time in Paris?"},
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                  {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Paris"}'}}]},
              {"role": "tool", "tool_call_id": "c1", "content": RESULT},
              {"role": "tool", "tool_call_id": "c2", "content": TIME},
              {"role": "assistant", "content": ANSWER},
              {"role": "user", "content": "And in Oslo?"},
              {"role": "assistant", "content": "Let me look.", "tool_calls": [
                  {"id": "c3", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
          ]}
QWEN_AGENT = {"id": "qwen-agent", "functions": [WEATHER, CLOCK], "messages": [
    {"role": "system", "content": "You help travellers."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "assistant", "content": "", "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"role": "assistant", "content": "", "function_call": {"name": "get_time", "arguments": '{"city": "Paris"}'}},
    {"role": "function", "name": "get_weather", "content": RESULT},
    {"role": "function", "name": "get_time", "content": TIME},
    {"role": "assistant", "content": ANSWER},
    {"role": "user", "content": "And in Oslo?"},
    {"role": "assistant", "content": "Let me look.", "function_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
]}
SHAREGPT = {"id": "sharegpt", "system": "You help travellers.", "tools": json.dumps([WEATHER, CLOCK]), "conversations": [
    {"from": "human", "value": "Weather and time in Paris?"},
    {"from": "function_call", "value": json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}},
                                                   {"name": "get_time", "arguments": {"city": "Paris"}}])},
    {"from": "observation", "value": RESULT},
    {"from": "observation", "value": TIME},
    {"from": "gpt", "value": ANSWER},
    {"from": "human", "value": "And in Oslo?"},
    {"from": "gpt", "value": "Let me look."},
    {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}})},
]}
SWIFT = {"id": "swift", "tools": json.dumps([WEATHER, CLOCK]), "messages": [
    {"role": "system", "content": "You help travellers."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {"role": "tool_call", "content": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
    {"role": "tool_call", "content": json.dumps({"name": "get_time", "arguments": {"city": "Paris"}})},
    {"role": "tool_response", "content": RESULT},
    {"role": "tool_response", "content": TIME},
    {"role": "assistant", "content": ANSWER},
    {"role": "user", "content": "And in Oslo?"},
    {"role": "assistant", "content": "Let me look."},
    {"role": "tool_call", "content": json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}})},
]}
FORMS = [OPENAI, QWEN_AGENT, SHAREGPT, SWIFT]


@pytest.fixture(scope="module")
def convs(tmp_path_factory):
    path = write_jsonl(tmp_path_factory.mktemp("tools") / "tools.jsonl", FORMS)
    return load_conversations(str(path))


def _tokenizer(tiny_model, name: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
    return tok


def _plain(msgs):
    """Messages without the call ids (which some forms carry and others cannot)."""
    return [{**m, "tool_calls": [{"type": c["type"], "function": c["function"]} for c in m["tool_calls"]]}
            if "tool_calls" in m else {k: v for k, v in m.items() if k not in ("name", "tool_call_id")} for m in msgs]


def test_every_form_gives_the_same_messages_and_tools(convs):
    first = convs[0]
    assert [c.id for c in convs] == ["openai", "qwen-agent", "sharegpt", "swift"]
    for c in convs:
        assert _plain(c.messages) == _plain(first.messages), c.id
        assert c.tools == first.tools, c.id
    roles = [m["role"] for m in first.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant", "user", "assistant"]
    call = first.messages[2]["tool_calls"][0]["function"]
    assert call == {"name": "get_weather", "arguments": {"city": "Paris"}}  # a JSON string becomes the object


@pytest.mark.parametrize("template", ["qwen2.5", "qwen3"])
def test_labels_match_the_templates_own_account_token_by_token(tiny_model, convs, template):
    tok = _tokenizer(tiny_model, template)
    marked = (TEMPLATES / f"{template}-generation-marked.jinja").read_text()
    enc = ChatEncoder(tok, 100_000)
    for conv in convs:
        e = enc.encode(conv)
        ref = tok.apply_chat_template(list(conv.messages), tools=list(conv.tools), chat_template=marked,
                                      tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        text = tok.apply_chat_template(list(conv.messages), tools=list(conv.tools), tokenize=False)
        marked_text = tok.apply_chat_template(list(conv.messages), tools=list(conv.tools), chat_template=marked,
                                              tokenize=False)
        assert marked_text == text  # the marked template renders exactly the model's text
        assert e.input_ids == list(ref["input_ids"])
        want = [t if m else IGNORE_INDEX for t, m in zip(ref["input_ids"], ref["assistant_masks"])]
        assert e.labels == want, conv.id
        labelled = tok.decode([t for t in e.labels if t != IGNORE_INDEX])
        # the calls are learnt, in the template's own spelling; the results and the schema are not
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in labelled
        assert '"get_time", "arguments": {"city": "Paris"}' in labelled and ANSWER in labelled
        assert "clear skies" not in labelled.replace(ANSWER, "") and "14:05" not in labelled.replace(ANSWER, "")
        assert "Current weather of a city" not in labelled and "<tools>" not in labelled
        assert "tool_response" not in labelled and "Weather and time" not in labelled
        assert labelled.endswith('{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>')


BAD = {
    "result-without-call": ({"id": "r", "messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "x"},
                                                     {"role": "assistant", "content": "a"}]},
                            "messages[1] is a tool result with no tool call before it"),
    "arguments-not-json": ({"id": "a", "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{city: Paris"}}]}]},
        "messages[1].tool_calls[0] (f): arguments are not valid JSON"),
    "unknown-tool": ({"id": "u", "tools": [WEATHER], "conversations": [
        {"from": "human", "value": "q"}, {"from": "function_call", "value": '{"name": "book_flight", "arguments": {}}'}]},
        "conversations[1] calls 'book_flight', which is not among the record's tools (get_weather)"),
    "call-without-name": ({"id": "n", "messages": [{"role": "user", "content": "q"},
                                                   {"role": "tool_call", "content": '{"arguments": {}}'}]},
                          "messages[1].content has no function name"),
    "empty-reply": ({"id": "e", "messages": [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": None}]},
                    "messages[1].content must be a string, got NoneType"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_tool_turn_is_refused_naming_record_and_turn(tmp_path, case):
    rec, problem = BAD[case]
    path = write_jsonl(tmp_path / "d.jsonl", [OPENAI, rec])
    with pytest.raises(InputError) as e:
        load_conversations(str(path))
    assert f"d.jsonl:2: record 1 (id {rec['id']!r}): {problem}" in str(e.value)


def test_a_template_without_tool_support_is_refused_not_silently_unlabelled(tiny_model, convs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)  # the tiny model's own Qwen2 template renders no tool calls
    with pytest.raises(InputError, match=r"record 0 \(id 'openai'\): the chat template does not render the record's "
                                         r"tools"):
        ChatEncoder(tok, 4096).encode(convs[0])
    no_tools = type(convs[0])(0, "x", convs[0].messages, ())
    with pytest.raises(InputError, match=r"does not render the tool calls of assistant turn 2 \(get_weather, get_time\)"):
        ChatEncoder(tok, 4096).encode(no_tools)


def test_the_data_preview_counts_tool_turns_their_tokens_and_each_sources_share(tiny_model, tmp_path):
    """training.datapreview (what `qwen-tui data` runs on the master) on a mixture of the tool records and chat
    records: the calls and results with their tokens, each source's share of the records and tokens."""
    import shutil

    from qwen_tui.advice.datapreview import build_report, summary_lines
    from qwen_tui.preset.files import load_preset
    from support.paths import DEMO
    from support.worker import demo_records
    from training.args import parse_args
    from training.datapreview import preview

    model = tmp_path / "tiny-tools"
    shutil.copytree(tiny_model, model)
    tok = _tokenizer(tiny_model, "qwen2.5")
    tok.save_pretrained(model)
    tools = write_jsonl(tmp_path / "tools.jsonl", FORMS)
    chat = write_jsonl(tmp_path / "chat.jsonl", demo_records(8))
    spec = json.dumps([{"path": str(tools), "records": 6}, {"path": str(chat)}])
    args = parse_args(["--model_name_or_path", str(model), "--datasets", spec, "--output_dir", str(tmp_path / "o"),
                       "--per_device_train_batch_size", "2", "--model_max_length", "1024", "--max_steps", "1"])
    rep = preview(args, world_size=1, cuda=False)
    t = rep["tools"]
    # 6 tool records (4 forms, 2 of them twice): 3 calls and 2 results each
    assert (t["records_with_tools"], t["tool_calls"], t["tool_results"]) == (6, 18, 12)
    per_record = len(tok(RESULT, add_special_tokens=False)["input_ids"]) + \
        len(tok(TIME, add_special_tokens=False)["input_ids"])
    assert t["result_tokens"] == 6 * per_record
    assert t["call_tokens"] > 6 * 3 * len(tok('{"city": "Paris"}', add_special_tokens=False)["input_ids"])
    src = {s["name"]: s for s in rep["sources"]}
    assert (src["tools.jsonl"]["records"], src["chat.jsonl"]["records"]) == (6, 8)
    assert src["tools.jsonl"]["repeated"] and src["tools.jsonl"]["share_records"] == round(6 / 14, 4)
    assert src["tools.jsonl"]["tokens"] + src["chat.jsonl"]["tokens"] == rep["tokens"]
    assert src["tools.jsonl"]["share_tokens"] > src["tools.jsonl"]["share_records"]  # tool records are long
    lines = "\n".join(summary_lines(build_report(rep, load_preset(DEMO), None)))
    assert "tools: 6 records with tools, 18 calls" in lines and "12 results" in lines
    assert "source tools.jsonl (auto): 6 of 4 records (repeated), 42.9% of the records" in lines


PREF_FORMS = [
    {"id": "trl", "tools": [WEATHER], "prompt": [{"role": "user", "content": "Weather in Oslo?"}],
     "chosen": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
         "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}],
     "rejected": [{"role": "assistant", "content": "I cannot look that up."}]},
    {"id": "trl-implicit", "tools": [WEATHER],
     "chosen": [{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "tool_calls": [
         {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}],
     "rejected": [{"role": "user", "content": "Weather in Oslo?"},
                  {"role": "assistant", "content": "I cannot look that up."}]},
    {"id": "llamafactory", "tools": json.dumps([WEATHER]), "conversations": [{"from": "human", "value": "Weather in Oslo?"}],
     "chosen": {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Oslo"}}'},
     "rejected": {"from": "gpt", "value": "I cannot look that up."}},
    {"id": "swift", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "tool_call", "content": '{"name": "get_weather", "arguments": {"city": "Oslo"}}'}],
     "rejected_response": "I cannot look that up."},
]


def test_preference_pairs_in_every_form_with_a_tool_call_label_only_the_answers(tiny_model, tmp_path):
    from training.data.records import load_pairs

    pairs = load_pairs(str(write_jsonl(tmp_path / "pairs.jsonl", PREF_FORMS)))
    first = pairs[0]
    for p in pairs:
        assert (_plain(p.chosen.messages), _plain(p.rejected.messages)) == \
            (_plain(first.chosen.messages), _plain(first.rejected.messages)), p.id
        assert p.chosen.first_labelled == 1 and p.chosen.tools == first.chosen.tools
    enc = ChatEncoder(_tokenizer(tiny_model, "qwen2.5"), 4096)
    tok = enc.tok
    c, r = enc.encode(first.chosen), enc.encode(first.rejected)
    assert tok.decode([t for t in c.labels if t != IGNORE_INDEX]) == \
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>'
    assert tok.decode([t for t in r.labels if t != IGNORE_INDEX]) == "I cannot look that up.<|im_end|>"
    two = load_pairs(str(write_jsonl(tmp_path / "two.jsonl", [{"prompt": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."},
        {"role": "user", "content": "Bye"}], "chosen": "Goodbye!", "rejected": "No."}])))[0]
    assert tok.decode([t for t in enc.encode(two.chosen).labels if t != IGNORE_INDEX]) == "Goodbye!<|im_end|>"
    bad = {"id": "same", "prompt": "hi", "chosen": "a", "rejected": "a"}
    with pytest.raises(InputError, match=r"record 0 \(id 'same'\): chosen and rejected are the same answer"):
        load_pairs(str(write_jsonl(tmp_path / "bad.jsonl", [bad])))
