"""The input of a step's form: an Input that leaves `?` to the step (its help), so that `?` never types
over a field's value (a focused Input selects its text, and the next key replaces it). No preset field
takes a `?`; dialogs (a path, a chat) use the plain Input, where `?` types as usual."""

from __future__ import annotations

from textual.widgets import Input


class FieldInput(Input):
    def check_consume_key(self, key: str, character: str | None) -> bool:
        return key != "question_mark" and super().check_consume_key(key, character)
