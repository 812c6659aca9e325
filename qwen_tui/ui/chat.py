"""The Run step's chat with a finished run's model (`c`): one message a line, replies from
qwen_tui.run.tools.after.chat_turn on the master (training.chat through the tokenizer's chat template), each
in a thread worker that posts its answer back; the model answers the whole conversation every turn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Input, Static

from .dialog import Dialog
from .styles import ERROR, GOOD_STRONG, NOTE_STRONG, tone
from .widgets.form_inputs import OrderedInput

if TYPE_CHECKING:
    from ..run.api import Transport
    from ..run.tools.after import RunResult


class ChatReply(Message):
    def __init__(self, reply: str | None = None, error: str | None = None) -> None:
        super().__init__()
        self.reply, self.error = reply, error


class ChatScreen(Dialog[None]):
    BINDINGS = [Binding("escape", "close", "Close")]
    WIDE = True
    DIALOG_ID = "chat-dialog"

    def __init__(self, result: RunResult, transport: Transport) -> None:
        super().__init__(f"Chat with {result.output_dir}")
        self.result, self.transport = result, transport
        self.messages: list[dict[str, str]] = []
        self.busy = False

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="chat-log"):
            yield Static(Text("Type a message and press Enter; Esc closes. The model loads on the master for "
                              "each reply.", style="dim"), id="chat-hint")
        yield OrderedInput(placeholder="your message", id="chat-input")

    def on_mount(self) -> None:
        self.query_one("#chat-input", Input).focus()

    def on_input_submitted(self, ev: Input.Submitted) -> None:
        text = ev.value.strip()
        if not text or self.busy:
            return
        ev.input.value = ""
        self.messages.append({"role": "user", "content": text})
        self._add(Text("you  ", style=tone(NOTE_STRONG)) + Text(text))
        self._add(Text("…", style="dim italic"), id="chat-wait")
        self.busy = True
        self._ask(list(self.messages))

    @work(thread=True, exclusive=True, exit_on_error=False, group="chat")
    def _ask(self, messages: list[dict[str, str]]) -> None:
        from ..run.tools.after import AfterRunError, chat_turn

        try:
            rep = chat_turn(self.result, self.transport, messages)
        except AfterRunError as e:
            self.post_message(ChatReply(error=str(e)))
            return
        self.post_message(ChatReply(reply=rep["reply"]))

    def on_chat_reply(self, msg: ChatReply) -> None:
        self.busy = False
        for w in self.query("#chat-wait"):
            w.remove()
        if msg.error is not None:
            self.messages.pop()  # the question goes unanswered: ask again
            self._add(Text(f"✘ {msg.error}", style=tone(ERROR)))
            return
        self.messages.append({"role": "assistant", "content": msg.reply})
        self._add(Text("model  ", style=tone(GOOD_STRONG)) + Text(msg.reply or "(an empty reply)"))

    def _add(self, text: Text, id: str | None = None) -> None:
        log = self.query_one("#chat-log", VerticalScroll)
        log.mount(Static(text, id=id, classes="chat-line"))
        log.scroll_end(animate=False)

    def action_close(self) -> None:
        self.dismiss(None)
