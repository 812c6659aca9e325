"""The inputs and selects of the forms and dialogs: they keep every key in the order it was typed.

Textual hands a key to the widget that had the focus when the App read it. An Input inserts a printable key
in its own queue at once, but its editing keys (backspace, ctrl+u, end, ...) and tab are bindings, and a bound
key first bubbles through every parent's queue to the App, which runs the action there. On a busy machine (the
master trains too) the keys typed after it so land first: "ctrl+u 0.002" ended as "" (typed, then cleared),
"tab 4" typed the 4 into the field being left (a known Textual behaviour, textual#6605). These widgets run their own bindings, and
the moves of focus, in their own queue, in order with the rest, and hand a key that was queued here before the
focus moved to the widget that has it now. Other keys (a step's F-keys, ctrl+s) still go to the App: their
actions may remove this very widget, which its own queue could not wait for.

`FieldInput`, the input of a step's form, also leaves `?` to the step (its help), so that `?` never types over a
field's value (a focused Input selects its text, and the next key replaces it). No preset field takes a `?`;
dialogs (a path, a chat) use `OrderedInput`, where `?` types as usual."""

from __future__ import annotations

from textual import events
from textual.widgets import Input, Select

FOCUS_MOVES = {"app.focus_next", "app.focus_previous", "focus_next", "focus_previous"}


class KeysInOrder:
    """Mixed into a focusable widget (before the widget's class)."""

    async def _on_key(self, event: events.Key) -> None:
        now = self.app.focused
        if now is not None and now is not self and self in now.ancestors:
            return  # a key of a child that has the focus (a select's open list), bubbling: Textual's way
        if now is not self:  # a tab still queued here moved the focus: the key is the new one's
            event.stop()
            event.prevent_default()
            (now or self.app.screen).post_message(events.Key(event.key, event.character))
            return
        if self.check_consume_key(event.key, event.character):
            return  # a character the widget takes (an Input inserts it)
        # a priority binding is the App's, and ran before the key reached here
        todo = [(b.action, self) for b in self._bindings.key_to_bindings.get(event.key, ()) if not b.priority]
        moved = self.screen.active_bindings.get(event.key)
        if moved is not None and not moved.binding.priority and moved.binding.action in FOCUS_MOVES:
            todo.append((moved.binding.action, moved.node))
        for action, node in todo:
            if await self.app.run_action(action, node):  # False: the action declined (SkipAction), let it bubble
                event.stop()
                event.prevent_default()
                return


class OrderedInput(KeysInOrder, Input):
    pass


class OrderedSelect(KeysInOrder, Select):
    pass


class FieldInput(OrderedInput):
    def check_consume_key(self, key: str, character: str | None) -> bool:
        return key != "question_mark" and super().check_consume_key(key, character)


class PathInput(OrderedInput):
    """A path field: Tab completes it from the files there, as a shell does (directories and presets); where there
    is nothing to add, the matches are shown and the focus stays; with no match at all, Tab moves on as usual."""

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "tab" and self.app.focused is self:
            import os

            from ...wizard.paths import complete_path

            done = complete_path(self.value, os.getcwd())  # relative paths open against it too
            if done.options:
                event.stop()
                event.prevent_default()
                if done.text != self.value:
                    self.value = done.text
                    self.cursor_position = len(done.text)
                if len(done.options) > 1:
                    shown = "  ".join(done.options[:12]) + ("  …" if len(done.options) > 12 else "")
                    self.app.notify(shown, title=f"{len(done.options)} matches")
                return
        await super()._on_key(event)
