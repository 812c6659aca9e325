"""Writes demo_chat.jsonl: the small chat data set behind `--data_path builtin:demo-chat`.

Run `python -m training.demo_data.make_demo_chat` to regenerate it; the output is
byte-for-byte deterministic (a seeded RNG, no clock, no hash order).

The records are short, varied and learnable on purpose: a tiny random model
trained with LoRA for 30-60 steps must show its loss falling, so the replies
follow a handful of regular patterns (arithmetic, capitals, colours, word
translations, greetings) that a model can pick up quickly. Multi-turn records,
system prompts (some of which change the reply style) and non-ASCII text
exercise the same code paths that real Qwen data does.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).with_name("demo_chat.jsonl")
N_RECORDS = 400
SEED = 20240607

SYSTEMS = [
    None,  # no system prompt: the template's default one applies
    "You are a helpful assistant.",
    "You are a concise assistant. Answer in one short sentence.",
    "You are a friendly tutor who likes numbers.",
]
PIRATE = "You are a pirate. Start every answer with 'Arr!'"

CAPITALS = [
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Germany", "Berlin"), ("Egypt", "Cairo"), ("Peru", "Lima"), ("Kenya", "Nairobi"),
    ("Canada", "Ottawa"), ("Norway", "Oslo"), ("Greece", "Athens"), ("Chile", "Santiago"),
    ("Iceland", "Reykjavík"), ("Türkiye", "Ankara"), ("China", "Beijing (北京)"),
]
COLOURS = [
    ("the sky", "blue"), ("grass", "green"), ("snow", "white"), ("a banana", "yellow"),
    ("coal", "black"), ("a tomato", "red"), ("an orange", "orange"), ("a plum", "purple"),
]
WORDS = {
    "hello": {"French": "bonjour", "Japanese": "こんにちは", "Spanish": "hola", "German": "hallo", "Chinese": "你好"},
    "thank you": {"French": "merci", "Japanese": "ありがとう", "Spanish": "gracias", "German": "danke", "Chinese": "谢谢"},
    "cat": {"French": "chat", "Japanese": "猫 (neko)", "Spanish": "gato", "German": "Katze", "Chinese": "猫"},
    "water": {"French": "eau", "Japanese": "水 (mizu)", "Spanish": "agua", "German": "Wasser", "Chinese": "水"},
    "coffee": {"French": "café", "Japanese": "コーヒー", "Spanish": "café", "German": "Kaffee", "Chinese": "咖啡"},
}
GREETINGS = [
    ("Hi!", "Hello! How can I help you today?"),
    ("Good morning.", "Good morning! How can I help you today?"),
    ("Hey there 👋", "Hello! 👋 How can I help you today?"),
    ("Thanks, bye!", "You're welcome. Goodbye!"),
]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def arithmetic(rng: random.Random) -> list[tuple[str, str]]:
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    turns = [(f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.")]
    if rng.random() < 0.5:
        turns.append(("And times 2?", f"{a + b} times 2 is {2 * (a + b)}."))
    if rng.random() < 0.3:
        turns.append((f"What is {a + b} minus {a}?", f"{a + b} minus {a} is {b}."))
    return turns


def capital(rng: random.Random) -> list[tuple[str, str]]:
    first = rng.sample(CAPITALS, k=rng.choice([1, 2]))
    turns = []
    for i, (country, city) in enumerate(first):
        q = f"What is the capital of {country}?" if i == 0 else f"And of {country}?"
        turns.append((q, f"The capital of {country} is {city}."))
    return turns


def colour(rng: random.Random) -> list[tuple[str, str]]:
    thing, col = rng.choice(COLOURS)
    return [(f"What colour is {thing}?", f"{thing[0].upper() + thing[1:]} is {col}.")]


def translate(rng: random.Random) -> list[tuple[str, str]]:
    word = rng.choice(sorted(WORDS))
    langs = rng.sample(sorted(WORDS[word]), k=rng.choice([1, 2]))
    turns = []
    for i, lang in enumerate(langs):
        q = f"How do you say '{word}' in {lang}?" if i == 0 else f"And in {lang}?"
        turns.append((q, f"In {lang}, '{word}' is '{WORDS[word][lang]}'."))
    return turns


def spell(rng: random.Random) -> list[tuple[str, str]]:
    n = rng.randint(0, 10)
    return [(f"Write the number {n} as a word.", f"{n} is written '{NUMBER_WORDS[n]}'.")]


def greeting(rng: random.Random) -> list[tuple[str, str]]:
    return [rng.choice(GREETINGS)]


TOPICS = [arithmetic, capital, colour, translate, spell, greeting]


def make_record(i: int, rng: random.Random) -> dict:
    turns: list[tuple[str, str]] = []
    # Most records hold one topic; some chain two topics into a longer chat.
    for topic in rng.sample(TOPICS, k=1 if rng.random() < 0.7 else 2):
        turns.extend(topic(rng))
    system = PIRATE if rng.random() < 0.15 else rng.choice(SYSTEMS)
    conv = []
    if system is not None:
        conv.append({"from": "system", "value": system})
    for q, a in turns:
        conv.append({"from": "user", "value": q})
        conv.append({"from": "assistant", "value": f"Arr! {a}" if system == PIRATE else a})
    return {"id": f"demo-{i:04d}", "conversations": conv}


def build() -> list[dict]:
    rng = random.Random(SEED)
    return [make_record(i, rng) for i in range(N_RECORDS)]


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for rec in build():
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"wrote {N_RECORDS} records to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
