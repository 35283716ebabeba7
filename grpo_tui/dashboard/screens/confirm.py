"""Modal dialogs that answer to the keyboard: y / n, Enter / Escape."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape  # "[y]" is a key hint, not markup
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class ConfirmScreen(ModalScreen[bool | str]):
    """Ask a yes/no question; dismisses with True (y / Enter) or False (n / Escape)."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("enter", "answer(True)", "Yes", show=False, id="confirm.enter"),
        Binding("n", "answer(False)", "No", id="confirm.no"),
        Binding("escape", "answer(False)", "No", show=False, id="confirm.escape"),
    ]

    # The answer of the optional third choice (`also`): truthy, so a plain yes/no caller treats it as yes.
    ALSO = "also"

    def __init__(
        self, question: str, detail: str = "", yes: str = "Yes", no: str = "No", also: tuple[str, str] | None = None
    ) -> None:
        """`also` = (key, label): a third answer, ALSO, given by that key or its button (e.g. x: kill now)."""
        super().__init__()
        self.question = question
        self.detail = detail
        self.yes_label = yes
        self.no_label = no
        self.also = also

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog"):
            yield Label(self.question, id="question", classes="dialog-title")
            if self.detail:
                yield Label(self.detail, id="detail", classes="dialog-detail")
            with Horizontal(classes="dialog-buttons"):
                yield Button(escape(f"{self.yes_label} [y]"), id="yes", variant="error")
                if self.also is not None:
                    yield Button(escape(f"{self.also[1]} [{self.also[0]}]"), id="also", variant="error")
                yield Button(escape(f"{self.no_label} [n]"), id="no", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(self.ALSO if event.button.id == "also" else event.button.id == "yes")

    def on_key(self, event: events.Key) -> None:
        if self.also is not None and event.key == self.also[0]:
            event.stop()
            self.dismiss(self.ALSO)

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class QuitScreen(ModalScreen[str]):
    """Quitting while a run is live: stop it, leave it running, or cancel.

    Dismisses with "stop", "leave" or "cancel", or with "ended" once none of the runs is live any more (it
    asks their run.json every POLL_S seconds): the question is moot then, and the user had asked to quit.
    """

    POLL_S = 1.0

    BINDINGS = [
        Binding("s", "choose('stop')", "Stop run and quit", id="quit.stop"),
        Binding("l", "choose('leave')", "Leave running and quit", id="quit.leave"),
        Binding("enter", "choose('leave')", "Leave running", show=False, id="quit.enter"),
        Binding("y", "choose('leave')", "Leave running", show=False, id="quit.yes"),
        Binding("n,escape", "choose('cancel')", "Cancel", id="quit.cancel"),
    ]

    def __init__(self, runs: list[Path]) -> None:
        super().__init__()
        self.runs = list(runs)

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog"):
            yield Label("Quit grpo-tui?", classes="dialog-title")
            yield Label(self._still_running(), id="still-running", classes="dialog-detail")
            yield Label("Runs live on when the app closes; reopen grpo-tui to re-attach.", classes="dialog-detail")
            with Horizontal(classes="dialog-buttons"):
                yield Button(escape("Leave running [l]"), id="leave", variant="primary")
                yield Button(escape("Stop run [s]"), id="stop", variant="error")
                yield Button(escape("Cancel [n]"), id="cancel")

    def on_mount(self) -> None:
        self.set_interval(self.POLL_S, self._check_runs)

    def _still_running(self) -> str:
        return "Still running: " + ", ".join(p.name for p in self.runs)

    @work(thread=True, exclusive=True, group="quit-poll")
    def _check_runs(self) -> None:
        from grpo_tui.dashboard.workers import call_from_worker
        from grpo_tui.runs.listing import live_among

        call_from_worker(self, self._runs_seen, live_among(self.runs))

    def _runs_seen(self, live: list[Path]) -> None:
        if not self.is_current:  # answered meanwhile
            return
        if not live:
            self.dismiss("ended")
        elif live != self.runs:
            self.runs = live
            self.query_one("#still-running", Label).update(self._still_running())

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(str(event.button.id))

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)
