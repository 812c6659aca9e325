"""The record formats users bring, each turned into OpenAI-style messages (the form chat templates take).

Pure Python: no torch, no transformers. One function a family, each raising BadRecord with the problem in words
(which turn, what is wrong); training.data.records adds the file, the line and the record.

Chat records (supervised fine-tuning):

    qwen / sharegpt  {"conversations": [{"from": "system"|"user"|"human"|"assistant"|"gpt"|"function_call"|
                      "observation", "value": "..."}], "system": "...", "tools": [...] or "[...]"}
                      (Qwen's own and LLaMA-Factory's sharegpt: a function_call turn is the assistant's call,
                      its value {"name", "arguments"} or a list of them; an observation turn is the tool's result)
    openai           {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "...",
                      "tool_calls": [{"type": "function", "function": {"name", "arguments"}}]}], "tools": [...]}
                      (also Qwen-Agent's and the older OpenAI function calling: an assistant "function_call" and
                      a "function" role; and ms-swift's "tool_call" / "tool_response" roles, whose consecutive
                      calls are one parallel call)
    alpaca           {"instruction", "input", "output", "system", "history": [[query, response], ...]}

Preference records (DPO):

    TRL              {"prompt": [messages], "chosen": [messages], "rejected": [messages]} (or strings), or
                      {"chosen": [messages], "rejected": [messages]} with the prompt as their shared beginning
    LLaMA-Factory    {"conversations": [...], "chosen": {"from": "gpt", "value"}, "rejected": {...}}
    ms-swift         {"messages": [..., {"role": "assistant", ...}], "rejected_response": "..."}

Tool calls come out as HF chat templates take them: {"type": "function", "function": {"name": ..., "arguments":
{...}}} with the arguments a JSON object (a JSON string is parsed: Qwen2.5's template would print it quoted), tools
as {"type": "function", "function": {"name", "description", "parameters"}}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

CHAT_FORMATS = ("qwen", "sharegpt", "openai", "alpaca")
PREFERENCE_FORMATS = ("trl", "sharegpt_pref", "swift_pref")
FORMATS = ("auto",) + CHAT_FORMATS + PREFERENCE_FORMATS

# from/value role names (Qwen's, ShareGPT's, LLaMA-Factory's) -> what the turn is
FROM_ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
              "function_call": "call", "observation": "tool", "tool": "tool", "function": "tool"}
# role names of message lists (OpenAI's, Qwen-Agent's, ms-swift's) -> what the turn is
MESSAGE_ROLES = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool", "function": "tool",
                 "tool_call": "call", "tool_response": "tool", "observation": "tool",
                 "human": "user", "gpt": "assistant"}


class BadRecord(ValueError):
    """What is wrong with one record, in words (the caller names the file and the record)."""


@dataclass(frozen=True)
class Tags:
    """LLaMA-Factory's `tags` of a sharegpt data set: the keys and role names its turns use."""
    role: str = "from"
    content: str = "value"
    roles: tuple = ()  # extra (name, kind) pairs: {"user_tag": "human"} becomes ("human", "user")

    def kind(self, name, table: dict) -> str | None:
        if not isinstance(name, str):
            return None
        for n, k in self.roles:
            if n == name:
                return k
        return table.get(name)


FROM_TAGS = Tags()
MESSAGE_TAGS = Tags(role="role", content="content")


def detect(obj: dict) -> str:
    """The format of one record from its keys; BadRecord when it is none of them or could be two."""
    keys = set(obj)
    pref = {"chosen", "rejected"} <= keys
    if "rejected_response" in keys and "messages" in keys:
        return "swift_pref"
    if pref and "conversations" in keys:
        return "sharegpt_pref"
    if pref:
        return "trl"
    if "conversations" in keys and "messages" in keys:
        raise BadRecord("has both 'conversations' and 'messages': say which format it is")
    if "conversations" in keys:
        return "qwen"
    if "messages" in keys:
        return "openai"
    if "instruction" in keys and "output" in keys:
        return "alpaca"
    raise BadRecord("has neither 'conversations' (Qwen format) nor 'messages' (OpenAI format), nor alpaca's "
                    "'instruction'/'output', nor a preference pair's 'chosen'/'rejected'")


def is_preference(fmt: str) -> bool:
    return fmt in PREFERENCE_FORMATS


# ------------------------------------------------------------------ pieces

def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _text(value, where: str, *, allow_none: bool = False) -> str:
    if value is None and allow_none:
        return ""
    if not isinstance(value, str):
        raise BadRecord(f"{where} must be a string, got {type(value).__name__}")
    if not _encodable(value):
        raise BadRecord(f"{where} holds a lone surrogate (an unpaired \\ud800-\\udfff escape): not text a tokenizer "
                        "can read")
    return value


def _json_value(value, where: str):
    """A JSON string parsed (tools, calls and arguments often come as strings), anything else as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as e:
            raise BadRecord(f"{where} is not valid JSON: {e}") from None
    return value


def tools_of(value, where: str = "tools") -> tuple:
    """A record's tool schemas: a list (or a JSON string of one) of function schemas, each as
    {"type": "function", "function": {...}}."""
    if value is None or value == "" or value == []:
        return ()
    value = _json_value(value, where)
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise BadRecord(f"{where} must be a list of function schemas, got {type(value).__name__}")
    out = []
    for i, t in enumerate(value):
        if not isinstance(t, dict):
            raise BadRecord(f"{where}[{i}] must be an object, got {type(t).__name__}")
        fn = t.get("function") if isinstance(t.get("function"), dict) else t
        name = fn.get("name")
        if not isinstance(name, str) or not name.strip():
            raise BadRecord(f"{where}[{i}] has no function name")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise BadRecord(f"{where}[{i}] ({name}): 'parameters' must be an object (a JSON schema)")
        out.append({"type": "function", "function": fn})
    return tuple(out)


def _call(value, where: str) -> dict:
    """One tool call in any of its spellings -> {"type": "function", "function": {"name", "arguments": {...}}}."""
    value = _json_value(value, where)
    if not isinstance(value, dict):
        raise BadRecord(f"{where} must be an object with 'name' and 'arguments', got {type(value).__name__}")
    fn = value.get("function") if isinstance(value.get("function"), dict) else value
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        raise BadRecord(f"{where} has no function name")
    args = fn.get("arguments", fn.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as e:
            raise BadRecord(f"{where} ({name}): arguments are not valid JSON: {e}") from None
    if not isinstance(args, dict):
        raise BadRecord(f"{where} ({name}): arguments must be a JSON object, got {type(args).__name__}")
    call = {"type": "function", "function": {"name": name, "arguments": args}}
    if isinstance(value.get("id"), str):
        call["id"] = value["id"]
    return call


def _calls(value, where: str) -> list[dict]:
    value = _json_value(value, where)
    items = value if isinstance(value, list) else [value]
    if not items:
        raise BadRecord(f"{where} holds no tool call")
    return [_call(c, f"{where}[{i}]" if isinstance(value, list) else where) for i, c in enumerate(items)]


class _Builder:
    """Messages as a record's turns are read, with the checks that need the turns before."""

    def __init__(self):
        self.messages: list[dict] = []
        self.where: list[str] = []  # each message's turn, as the record spells it ("messages[3]")

    def add(self, kind: str, content: str, where: str, *, calls=None, extra=None) -> None:
        if kind == "assistant" and calls and not content.strip() and self.messages and \
                self.messages[-1].get("tool_calls"):
            kind = "call"  # calls one message each after a call (Qwen-Agent's parallel calls): one turn
        if kind == "call":  # a tool call turn joins the assistant turn before it (parallel calls, text + call)
            last = self.messages[-1] if self.messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).extend(calls)
                return
            kind = "assistant"
        if kind == "tool":
            prev = self.messages[-1] if self.messages else None
            if prev is None or not (prev["role"] == "tool" or prev.get("tool_calls")):
                raise BadRecord(f"{where} is a tool result with no tool call before it")
        msg = {"role": kind, "content": content}
        if calls:
            msg["tool_calls"] = list(calls)
        if extra:
            msg.update(extra)
        self.messages.append(msg)
        self.where.append(where)

    def finish(self, tools: tuple) -> tuple[list[dict], tuple]:
        names = {t["function"]["name"] for t in tools}
        for msg, where in zip(self.messages, self.where):
            if msg["role"] != "assistant":
                continue
            if not msg["content"].strip() and not msg.get("tool_calls"):
                raise BadRecord(f"{where} is an empty assistant reply")
            for c in msg.get("tool_calls", ()):
                name = c["function"]["name"]
                if names and name not in names:
                    raise BadRecord(f"{where} calls {name!r}, which is not among the record's tools "
                                    f"({', '.join(sorted(names))})")
        return self.messages, tools


def _system_first(b: _Builder, system, where: str) -> None:
    if system is None or system == "":
        return
    b.add("system", _text(system, where), where)


# ------------------------------------------------------------------ chat formats

def from_value(obj: dict, field: str = "conversations", tags: Tags = FROM_TAGS) -> tuple[list[dict], tuple]:
    """Qwen's and ShareGPT's {"from", "value"} turns (LLaMA-Factory's function_call / observation too)."""
    turns = obj.get(field)
    if not isinstance(turns, list):
        raise BadRecord(f"'{field}' must be a list, got {type(turns).__name__}")
    if not turns:
        raise BadRecord(f"empty conversation ('{field}' is [])")
    tools = tools_of(obj.get("tools"))
    b = _Builder()
    if not (isinstance(turns[0], dict) and tags.kind(turns[0].get(tags.role), FROM_ROLES) == "system"):
        _system_first(b, obj.get("system"), "system")
    for t, turn in enumerate(turns):
        where = f"{field}[{t}]"
        kind = _kind(turn, where, tags, FROM_ROLES)
        value = turn.get(tags.content)
        if kind == "call":
            b.add("call", "", where, calls=_calls(value, f"{where}.{tags.content}"))
        else:
            b.add(kind, _text(value, f"{where}.{tags.content}"), where)
    return b.finish(tools)


def _kind(turn, where: str, tags: Tags, table: dict) -> str:
    if not isinstance(turn, dict):
        raise BadRecord(f"{where} must be an object, got {type(turn).__name__}")
    if tags.role not in turn:
        raise BadRecord(f"{where} has no '{tags.role}'")
    kind = tags.kind(turn[tags.role], table)
    if kind is None:
        raise BadRecord(f"{where} has unknown role {turn[tags.role]!r} (expected system, user or assistant, or a "
                        "tool call or result)")
    return kind


def messages(obj: dict, field: str = "messages", tags: Tags = MESSAGE_TAGS) -> tuple[list[dict], tuple]:
    """OpenAI's messages, with tool_calls and tool turns (Qwen-Agent's function_call, ms-swift's tool roles too)."""
    turns = obj.get(field)
    if not isinstance(turns, list):
        raise BadRecord(f"'{field}' must be a list, got {type(turns).__name__}")
    if not turns:
        raise BadRecord(f"empty conversation ('{field}' is [])")
    tools = tools_of(obj.get("tools") if obj.get("tools") not in (None, "", []) else obj.get("functions"))
    b = _Builder()
    if not (isinstance(turns[0], dict) and tags.kind(turns[0].get(tags.role), MESSAGE_ROLES) == "system"):
        _system_first(b, obj.get("system"), "system")
    for t, turn in enumerate(turns):
        where = f"{field}[{t}]"
        kind = _kind(turn, where, tags, MESSAGE_ROLES)
        content = turn.get(tags.content)
        if kind == "call":  # ms-swift: the content is the call
            b.add("call", "", where, calls=_calls(content, f"{where}.{tags.content}"))
            continue
        if kind == "assistant":
            calls = []
            if turn.get("tool_calls") not in (None, []):
                if not isinstance(turn["tool_calls"], list):
                    raise BadRecord(f"{where}.tool_calls must be a list, got {type(turn['tool_calls']).__name__}")
                calls = [_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(turn["tool_calls"])]
            if turn.get("function_call") is not None:
                calls.append(_call(turn["function_call"], f"{where}.function_call"))
            extra = {}
            if isinstance(turn.get("reasoning_content"), str):
                extra["reasoning_content"] = _text(turn["reasoning_content"], f"{where}.reasoning_content")
            b.add("assistant", _text(content, f"{where}.{tags.content}", allow_none=bool(calls)), where,
                  calls=calls, extra=extra)
            continue
        if kind == "tool" and isinstance(content, (dict, list)):
            content = json.dumps(content, ensure_ascii=False)  # a result given as a JSON value
        extra = {k: turn[k] for k in ("name", "tool_call_id") if kind == "tool" and isinstance(turn.get(k), str)}
        b.add(kind, _text(content, f"{where}.{tags.content}"), where, extra=extra)
    return b.finish(tools)


def alpaca(obj: dict) -> tuple[list[dict], tuple]:
    """Alpaca's instruction / input / output, with its optional system and history."""
    b = _Builder()
    _system_first(b, obj.get("system"), "system")
    history = obj.get("history") or []
    if not isinstance(history, list):
        raise BadRecord(f"'history' must be a list of [query, response] pairs, got {type(history).__name__}")
    for i, pair in enumerate(history):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise BadRecord(f"history[{i}] must be a [query, response] pair")
        b.add("user", _text(pair[0], f"history[{i}][0]"), f"history[{i}]")
        b.add("assistant", _text(pair[1], f"history[{i}][1]"), f"history[{i}]")
    instruction = _text(obj.get("instruction"), "instruction")
    query = _text(obj.get("input"), "input", allow_none=True)
    b.add("user", "\n".join(p for p in (instruction, query) if p), "instruction")
    b.add("assistant", _text(obj.get("output"), "output"), "output")
    return b.finish(tools_of(obj.get("tools")))


def chat(obj: dict, fmt: str, tags: Tags | None = None) -> tuple[list[dict], tuple]:
    """(messages, tools) of one chat record in `fmt` (a CHAT_FORMATS name, or auto)."""
    if fmt == "auto":
        fmt = detect(obj)
        if is_preference(fmt):
            raise BadRecord("is a preference pair (chosen/rejected): DPO data; train it with stage dpo")
    if fmt in ("qwen", "sharegpt"):
        if "conversations" not in obj and "messages" in obj:
            return from_value(obj, "messages", tags or MESSAGE_TAGS)
        if "conversations" not in obj:
            raise BadRecord("has no 'conversations' (the format given is " + fmt + ")")
        return from_value(obj, "conversations", tags or FROM_TAGS)
    if fmt == "openai":
        if "messages" not in obj:
            raise BadRecord("has no 'messages' (the format given is openai)")
        return messages(obj, "messages", tags or MESSAGE_TAGS)
    if fmt == "alpaca":
        return alpaca(obj)
    raise BadRecord(f"format {fmt!r} is not a chat format ({', '.join(CHAT_FORMATS)})")


# ------------------------------------------------------------------ preference formats

@dataclass(frozen=True)
class Pair:
    prompt: list  # messages before the answers
    chosen: list  # the preferred answer's messages (assistant turns, tool results between them)
    rejected: list
    tools: tuple


def _answer(value, where: str) -> list[dict]:
    """A TRL answer: a list of messages, one message, or a string (the assistant's text)."""
    if isinstance(value, str):
        return [{"role": "assistant", "content": _text(value, where)}]
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not value:
        raise BadRecord(f"'{where}' must be a non-empty list of messages or a string")
    msgs, _ = messages({where: value}, where)
    if msgs[0]["role"] != "assistant":
        raise BadRecord(f"{where}[0] must be the assistant's answer, got role {msgs[0]['role']!r}")
    return msgs


def _prompt(value, where: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": _text(value, where)}]
    if not isinstance(value, list) or not value:
        raise BadRecord(f"'{where}' must be a non-empty list of messages or a string")
    msgs, _ = messages({where: value}, where)
    return msgs


def _check_pair(pair: Pair) -> Pair:
    if not pair.prompt or pair.prompt[-1]["role"] == "assistant" and not pair.prompt[-1].get("tool_calls"):
        raise BadRecord("the prompt must end with a user turn or a tool result (the answers follow it)")
    names = {t["function"]["name"] for t in pair.tools}
    for side, msgs in (("chosen", pair.chosen), ("rejected", pair.rejected)):
        if pair.prompt[-1].get("tool_calls") and msgs[0]["role"] != "tool":
            raise BadRecord(f"the prompt ends with a tool call: {side} must start with its result")
        for i, m in enumerate(msgs):
            for c in m.get("tool_calls", ()):
                if names and c["function"]["name"] not in names:
                    raise BadRecord(f"{side}[{i}] calls {c['function']['name']!r}, which is not among the "
                                    f"record's tools ({', '.join(sorted(names))})")
    if pair.chosen == pair.rejected:
        raise BadRecord("chosen and rejected are the same answer: nothing to prefer")
    return pair


def preference(obj: dict, fmt: str) -> Pair:
    """The prompt and the two answers of one preference record in `fmt` (a PREFERENCE_FORMATS name, or auto)."""
    if fmt == "auto":
        fmt = detect(obj)
        if not is_preference(fmt):
            raise BadRecord("is not a preference pair: DPO needs 'chosen' and 'rejected' answers (TRL's "
                            "prompt/chosen/rejected, LLaMA-Factory's conversations + chosen/rejected, or ms-swift's "
                            "messages + rejected_response)")
    tools = tools_of(obj.get("tools"))
    if fmt == "trl":
        chosen_raw, rejected_raw = obj.get("chosen"), obj.get("rejected")
        if "prompt" in obj:
            prompt = _prompt(obj["prompt"], "prompt")
            if isinstance(obj.get("system"), str) and obj["system"] and prompt[0]["role"] != "system":
                prompt.insert(0, {"role": "system", "content": _text(obj["system"], "system")})
            return _check_pair(Pair(prompt, _answer(chosen_raw, "chosen"), _answer(rejected_raw, "rejected"), tools))
        # implicit prompt: the messages both lists share
        if not (isinstance(chosen_raw, list) and isinstance(rejected_raw, list)):
            raise BadRecord("without a 'prompt', 'chosen' and 'rejected' must be whole conversations (lists of "
                            "messages) that share their beginning")
        c, _ = messages({"chosen": chosen_raw}, "chosen")
        r, _ = messages({"rejected": rejected_raw}, "rejected")
        k = 0
        while k < min(len(c), len(r)) and c[k] == r[k]:
            k += 1
        while k > 0 and c[k - 1]["role"] == "assistant" and not c[k - 1].get("tool_calls"):
            k -= 1  # the answers start with the first assistant turn after the shared prompt
        if k == 0 or k >= len(c) or k >= len(r):
            raise BadRecord("'chosen' and 'rejected' share no prompt (or one holds nothing past it)")
        return _check_pair(Pair(c[:k], c[k:], r[k:], tools))
    if fmt == "sharegpt_pref":
        prompt, _ = from_value(obj, "conversations")
        return _check_pair(Pair(prompt, _sharegpt_answer(obj.get("chosen"), "chosen"),
                                _sharegpt_answer(obj.get("rejected"), "rejected"), tools))
    if fmt == "swift_pref":
        msgs, tools = messages(obj, "messages")
        if msgs[-1]["role"] != "assistant":
            raise BadRecord("the last message must be the chosen assistant answer (ms-swift's preference format)")
        rejected = obj.get("rejected_response")
        if isinstance(rejected, list):
            rej = _answer(rejected, "rejected_response")
        else:
            rej = [{"role": "assistant", "content": _text(rejected, "rejected_response")}]
        return _check_pair(Pair(msgs[:-1], msgs[-1:], rej, tools))
    raise BadRecord(f"format {fmt!r} is not a preference format ({', '.join(PREFERENCE_FORMATS)})")


def _sharegpt_answer(value, where: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "assistant", "content": _text(value, where)}]
    if not isinstance(value, dict):
        raise BadRecord(f"'{where}' must be a turn ({{'from': 'gpt', 'value': ...}}), got {type(value).__name__}")
    kind = _kind(value, where, FROM_TAGS, FROM_ROLES)
    if kind == "call":
        return [{"role": "assistant", "content": "", "tool_calls": _calls(value.get("value"), f"{where}.value")}]
    if kind != "assistant":
        raise BadRecord(f"'{where}' must be an assistant turn (gpt or function_call), got {value.get('from')!r}")
    text = _text(value.get("value"), f"{where}.value")
    if not text.strip():
        raise BadRecord(f"'{where}' is an empty assistant reply")
    return [{"role": "assistant", "content": text}]
