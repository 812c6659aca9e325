"""Chat records -> token ids and labels, and the data sets that hold them.

Masking: the conversation is rendered once with the tokenizer's own chat
template, and the character span of every assistant turn (from the end of
its `<|im_start|>assistant\\n` header through its end-of-turn token) is found
in that text, turn by turn, anchored on the turn's header and its content. Tokens whose characters lie
inside such a span get labels; all others get -100. An assistant turn's tool calls are part of its span (the
model learns to make them); tool results and the tools' schemas, rendered in other turns and the system
prompt, never are; neither are a preference pair's prompt turns (Conversation.first_labelled). Working on the rendered
text rather than on prefixes of the conversation keeps this right for
templates that render earlier turns differently from the last one (Qwen3
drops old thinking blocks and adds an empty one to the last reply).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from training.data.records import Conversation
from training.runtime.errors import InputError

IGNORE_INDEX = -100
log = logging.getLogger("training")

# ChatML, for a tokenizer that ships without a chat template (some base models).
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass
class Encoded:
    input_ids: list[int]
    labels: list[int]
    truncated: bool = False


@dataclass
class DataStats:
    records: int = 0
    truncated: int = 0  # longer than model_max_length, cut
    dropped: int = 0  # no supervised token left after the cut
    tokens: int = 0
    label_tokens: int = 0
    truncated_ids: list[str] = field(default_factory=list)


def log_stats(s: DataStats, label: str, unit: str, lazy: bool, max_length: int) -> None:
    """The data's counts in the log: records (or pairs), tokens, truncations and records dropped."""
    if lazy:
        log.info("%s: %d records checked; tokenizing lazily (truncations are counted as they happen)", label,
                 s.records)
        return
    log.info("%s: %d %s, %d tokens, %d of them supervised", label, s.records, unit, s.tokens, s.label_tokens)
    if s.truncated:
        shown = ", ".join(s.truncated_ids[:5]) + (" ..." if s.truncated > 5 else "")
        log.warning("%s: %d record(s) longer than --model_max_length %d were truncated (ids: %s)", label,
                    s.truncated, max_length, shown)
    if s.dropped:
        log.warning("%s: %d record(s) had no assistant token left after truncation and are skipped", label,
                    s.dropped)


class ChatEncoder:
    """Renders conversations with the chat template and labels the assistant turns."""

    def __init__(self, tokenizer, max_length: int):
        self.tok = tokenizer
        self.max_length = max_length
        if not getattr(tokenizer, "chat_template", None):
            log.warning("tokenizer has no chat template: using ChatML (Qwen's format)")
            tokenizer.chat_template = CHATML_TEMPLATE
        if not getattr(tokenizer, "is_fast", True):
            raise InputError("the tokenizer is not a fast (Rust) tokenizer: assistant masking needs character offsets")
        probe = [{"role": "user", "content": "hi"}]
        bare = self.render(probe)
        with_prompt = self.render(probe, add_generation_prompt=True)
        # The assistant header is what the generation prompt adds ("<|im_start|>assistant\n").
        self.header = with_prompt[len(bare):] if with_prompt.startswith(bare) else "<|im_start|>assistant\n"
        if not self.header:
            self.header = "<|im_start|>assistant\n"
        vocab = tokenizer.get_vocab()
        self.end_of_turn = "<|im_end|>" if "<|im_end|>" in vocab else tokenizer.eos_token
        if not self.end_of_turn:
            raise InputError("the tokenizer has neither <|im_end|> nor an eos token to end an assistant turn")

    def render(self, messages, add_generation_prompt: bool = False, tools=()) -> str:
        return self.tok.apply_chat_template(list(messages), tools=list(tools) or None, tokenize=False,
                                            add_generation_prompt=add_generation_prompt)

    def assistant_spans(self, text: str, conv: Conversation, parts: list | None = None) -> list[tuple[int, int]]:
        """The character spans of the assistant turns to train on. `parts`, when given, gets (kind, start, end)
        of each tool result's text ("tool") and each assistant turn's tool calls ("call")."""
        spans, cursor = [], 0
        if conv.tools and not any(t["function"]["name"] in text[:text.find(self.header) if self.header in text
                                                                  else len(text)] for t in conv.tools):
            raise InputError(f"record {conv.index} (id {conv.id!r}): the chat template does not render the record's "
                             "tools (a Qwen2.5 or Qwen3 chat template does)")
        for t, msg in enumerate(conv.messages):
            content = msg["content"]
            if msg["role"] != "assistant":
                # Skip past the turn's text so a later search cannot land inside it (templates may
                # rewrite system or user turns: then there is nothing to skip, and no label is lost).
                anchor = content.strip()
                pos = text.find(anchor, cursor) if anchor else -1
                cursor = pos + len(anchor) if pos >= 0 else cursor
                if parts is not None and msg["role"] == "tool" and pos >= 0:
                    parts.append(("tool", pos, cursor))
                continue
            if "</think>" in content:
                content = content.split("</think>")[-1]  # templates re-render the thinking part
            anchor = content.strip() or content
            head = text.find(self.header, cursor)
            start = head + len(self.header)
            pos = text.find(anchor, start) if head >= 0 else -1
            if pos < 0 or text.find(self.header, start, pos) >= 0:
                raise InputError(f"record {conv.index} (id {conv.id!r}): the chat template dropped or rewrote "
                                 f"assistant turn {t}; cannot tell which tokens to train on")
            end = text.find(self.end_of_turn, pos + len(anchor))
            if end < 0:
                raise InputError(f"record {conv.index} (id {conv.id!r}): no {self.end_of_turn} after assistant turn {t}")
            calls = msg.get("tool_calls") or ()
            if calls:
                body = text[pos + len(anchor):end]
                missing = [c["function"]["name"] for c in calls if c["function"]["name"] not in body]
                if missing:
                    raise InputError(f"record {conv.index} (id {conv.id!r}): the chat template does not render the "
                                     f"tool calls of assistant turn {t} ({', '.join(missing)}); a Qwen2.5 or Qwen3 "
                                     "chat template does")
                if parts is not None:
                    parts.append(("call", pos + len(anchor), end))
            if t >= conv.first_labelled:
                spans.append((start, end + len(self.end_of_turn)))
            cursor = end + len(self.end_of_turn)
        return spans

    def encode(self, conv: Conversation) -> Encoded:
        text = self.render(conv.messages, tools=conv.tools)
        spans = self.assistant_spans(text, conv)
        enc = self._tokenize_bounded(text)
        ids = list(enc["input_ids"])
        labels = [IGNORE_INDEX] * len(ids)
        s = 0
        for i, (a, b) in enumerate(enc["offset_mapping"]):
            while s < len(spans) and spans[s][1] <= a:
                s += 1
            if s < len(spans) and b > a and spans[s][0] <= a and b <= spans[s][1]:
                labels[i] = ids[i]
        truncated = len(ids) > self.max_length
        if truncated:
            ids, labels = ids[: self.max_length], labels[: self.max_length]
        return Encoded(ids, labels, truncated)

    # Characters per token to try first when bounding the work; real text is ~3-4.
    CHARS_PER_TOKEN = 8
    MARGIN_TOKENS = 16  # tokens past the cut: a prefix's last tokens can differ from the full text's

    def _tokenize_bounded(self, text: str):
        """Token ids and offsets of at least max_length + 1 tokens of `text` (all of it when it is
        shorter): a 50 MB record costs the tokenizer what its first max_length tokens cost.

        A prefix cut mid-word tokenizes differently only near the cut; the tokens kept are
        MARGIN_TOKENS before it and so are the full text's own. The prefix doubles until it
        holds enough tokens."""
        need = self.max_length + 1 + self.MARGIN_TOKENS
        chars = need * self.CHARS_PER_TOKEN
        while True:
            if chars >= len(text):
                return self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
            enc = self.tok(text[:chars], add_special_tokens=False, return_offsets_mapping=True)
            if len(enc["input_ids"]) >= need:
                keep = self.max_length + 1  # one past the cut: the record still counts as truncated
                return {"input_ids": enc["input_ids"][:keep], "offset_mapping": enc["offset_mapping"][:keep]}
            chars *= 2


def _has_labels(e: Encoded) -> bool:
    # The first token is never predicted, so a label there alone teaches nothing.
    return any(x != IGNORE_INDEX for x in e.labels[1:])


class EagerDataset(torch.utils.data.Dataset):
    """Tokenizes everything up front; records left without labels after truncation are dropped."""

    def __init__(self, convs: list[Conversation], encoder: ChatEncoder):
        self.items: list[Encoded] = []
        self.stats = DataStats(records=len(convs))
        for conv in convs:
            e = encoder.encode(conv)
            if e.truncated:
                self.stats.truncated += 1
                self.stats.truncated_ids.append(conv.id)
            if not _has_labels(e):
                self.stats.dropped += 1
                continue
            self.stats.tokens += len(e.input_ids)
            self.stats.label_tokens += sum(1 for x in e.labels if x != IGNORE_INDEX)
            self.items.append(e)

    @classmethod
    def from_items(cls, items: list[Encoded], stats: DataStats) -> "EagerDataset":
        """A data set tokenized earlier (training.data.token_cache)."""
        ds = cls.__new__(cls)
        ds.items, ds.stats = items, stats
        return ds

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i: int) -> Encoded:
        return self.items[i]


class LazyDataset(torch.utils.data.Dataset):
    """Tokenizes a record when it is read (--lazy_preprocess); truncation is counted as it happens.

    The counters live in this process (and in each data-loader worker): the
    training loop sums what the batches report instead.
    """

    # Nothing is tokenized up front: the fast path's row sizing (which reads EagerDataset.items) goes without.
    items: None = None

    def __init__(self, convs: list[Conversation], encoder: ChatEncoder):
        self.convs = convs
        self.encoder = encoder
        self.stats = DataStats(records=len(convs))

    def __len__(self):
        return len(self.convs)

    def __getitem__(self, i: int) -> Encoded:
        return self.encoder.encode(self.convs[i])
