"""Every binding of every screen: where, the key and what it does."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.keys import format_key
from textual.screen import ModalScreen
from textual.widgets import Static


def bindings_of(owner: type) -> list[Binding]:
    found: list[Binding] = []
    for item in getattr(owner, "BINDINGS", []):
        found.extend(Binding.make_bindings([item]) if not isinstance(item, Binding) else [item])
    return found


def key_text(binding: Binding) -> str:
    """The keys of `binding` as the help screen shows them: "escape / ? / q" for "escape,question_mark,q"."""
    if binding.key_display:
        return binding.key_display
    return " / ".join(_key_name(key) for key in binding.key.split(","))


def _key_name(key: str) -> str:
    # A typed symbol ("?" for question_mark) reads better; named keys (enter, ctrl+c) stay words, not glyphs.
    shown = format_key(key)
    return shown if len(shown) == 1 and shown.isascii() else key


def bindings_table(owners: list[tuple[str, type]]) -> Table:
    """A table of (where, key, description) for each owner's BINDINGS."""
    table = Table(expand=True, box=None, header_style="bold", pad_edge=False)
    table.add_column("where", style="dim", no_wrap=True)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("what it does", ratio=1)
    for where, owner in owners:
        for binding in bindings_of(owner):
            table.add_row(where, key_text(binding), binding.description or binding.action)
    return table


class HelpScreen(ModalScreen[None]):
    """`?`: what every key does, on every screen."""

    BINDINGS: list[BindingType] = [
        Binding("escape,question_mark,q", "dismiss", "Close help", id="help.close"),
    ]

    def __init__(self, owners: list[tuple[str, type]]) -> None:
        super().__init__()
        self.owners = owners

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body", classes="dialog wide"):
            yield Static(Text("Keys (the mouse works too: click tabs, rows, switches)", style="bold"))
            yield Static(bindings_table(self.owners), id="help-table")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)
