"""The input of a step's form: it keeps the keys' order (ordered_keys.py) and leaves `?` to the step (its
help), so that `?` never types over a field's value (a focused Input selects its text, and the next key replaces
it). No preset field takes a `?`; dialogs (a path, a chat) use `OrderedInput`, where `?` types as usual."""

from __future__ import annotations

from .ordered_keys import OrderedInput


class FieldInput(OrderedInput):
    def check_consume_key(self, key: str, character: str | None) -> bool:
        return key != "question_mark" and super().check_consume_key(key, character)
