"""The frame every dialog of the wizard shares: a modal screen holding a box with a title, the dialog's own body
and a row of buttons (app.tcss styles `.modal`, `.dialog`, `.dialog-title`, `.dialog-scroll`, `.dialog-buttons`).
A dialog says only what differs: its body (`compose_body`), its buttons (`compose_buttons`), whether it is wide,
and how it answers (`dismiss`)."""

from __future__ import annotations

from typing import ClassVar, TypeVar

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Label, Static

T = TypeVar("T")


class Dialog(ModalScreen[T]):
    WIDE: ClassVar[bool] = False  # the wide box (long text: errors, help, chat)
    DIALOG_ID: ClassVar[str | None] = None  # an id for the box, where tests or styles name it

    def __init__(self, title: str) -> None:
        super().__init__(classes="modal")
        self.title_text = title

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide" if self.WIDE else "dialog", id=self.DIALOG_ID):
            yield Label(self.title_text, classes="dialog-title")
            yield from self.compose_body()
            buttons = list(self.compose_buttons())
            if buttons:
                with Horizontal(classes="dialog-buttons"):
                    yield from buttons

    def compose_body(self) -> ComposeResult:
        """What sits between the title and the buttons."""
        return iter(())

    def compose_buttons(self) -> ComposeResult:
        """The buttons, left to right; none: no row of buttons."""
        return iter(())

    @staticmethod
    def scrolling(*widgets: Widget) -> VerticalScroll:
        """Text that may be longer than the terminal: it scrolls, the buttons stay in sight."""
        return VerticalScroll(*widgets, classes="dialog-scroll")

    @staticmethod
    def text(body: str, **kwargs: object) -> Static:
        """A paragraph of the dialog, as written (user values in it are never read as markup)."""
        return Static(body, classes="dialog-body", markup=False, **kwargs)  # type: ignore[arg-type]
