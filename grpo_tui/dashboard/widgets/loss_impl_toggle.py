"""chunked ⇄ baseline: a Switch (mouse) mirrored by the dashboard's `t` key; posts `Toggled`."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Label, Switch


class LossImplToggle(Horizontal):
    """On = chunked (our kernel), off = the preset's baseline. `pending` shows a request not yet applied."""

    DEFAULT_CSS = """
    LossImplToggle { height: 3; width: 1fr; }
    LossImplToggle Label { padding: 1 1 0 1; }
    """

    @dataclass
    class Toggled(Message):
        """The user flipped the switch: `loss_impl` is the implementation asked for."""

        loss_impl: str

    def __init__(self, baseline: str = "naive", current: str = "chunked", *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.baseline = baseline
        self.current = current
        self.pending: str | None = None

    def compose(self) -> ComposeResult:
        yield Label(id="impl-baseline")
        yield Switch(value=self.current == "chunked", id="impl-switch", tooltip="t: toggle chunked ⇄ baseline")
        yield Label(id="impl-chunked")
        yield Label(id="impl-state")

    def on_mount(self) -> None:
        self._render_labels()

    def set_current(self, current: str | None, pending: str | None = None) -> None:
        """Reflect the run: the impl of its last step and any request not yet acted on."""
        if current:
            self.current = current
        self.pending = pending if pending != self.current else None
        switch = self.query_one(Switch)
        target = (self.pending or self.current) == "chunked"
        if switch.value != target:
            with switch.prevent(Switch.Changed):  # mirroring the run is not a user request
                switch.value = target
        self._render_labels()

    def _render_labels(self) -> None:
        key = (self.current, self.pending, self.baseline)
        if key == getattr(self, "_drawn", None):
            return
        self._drawn = key
        on_chunked = self.current == "chunked"
        self.query_one("#impl-baseline", Label).update(Text(self.baseline, "bold" if not on_chunked else "dim"))
        self.query_one("#impl-chunked", Label).update(Text("chunked", "bold green" if on_chunked else "dim"))
        state = Text(f"→ {self.pending} at next step", "yellow") if self.pending else Text("[t] toggle", "dim")
        self.query_one("#impl-state", Label).update(state)

    @on(Switch.Changed, "#impl-switch")
    def _switched(self, event: Switch.Changed) -> None:
        event.stop()
        self.post_message(self.Toggled("chunked" if event.value else self.baseline))

    def target_of_toggle(self) -> str:
        """What a press of `t` asks for: the other side of whatever is current or pending."""
        showing = self.pending or self.current
        return self.baseline if showing == "chunked" else "chunked"
