"""The rename dialog (n on the presets screen): a new name for a user preset.

The checks and their one-line refusals are the CLI's (`presets rename`); a built-in's name is asked
about here instead of needing --shadow.
"""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from grpo_tui.config.preset_admin import rename_user_preset
from grpo_tui.config.schema import PresetError
from grpo_tui.config.store import builtin_name_message


class RenamePresetScreen(ModalScreen[str | None]):
    """Dismisses with the new name once the preset is renamed, or None (Escape / Cancel)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="rename.cancel")]

    def __init__(self, old: str) -> None:
        super().__init__()
        self.old = old

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog"):
            yield Label(f"Rename user preset {self.old}", classes="dialog-title")
            yield Label("New name (letters, digits, '.', '_' or '-'):", classes="dialog-detail")
            yield Input(self.old, id="rename-to")
            yield Label("", id="rename-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button(escape("Rename [Enter]"), id="rename-go", variant="primary")
                yield Button(escape("Cancel [Esc]"), id="rename-cancel")

    def on_mount(self) -> None:
        self.query_one("#rename-to", Input).focus()

    @property
    def new_name(self) -> str:
        return self.query_one("#rename-to", Input).value.strip()

    @on(Input.Changed, "#rename-to")
    def _clear_error(self) -> None:
        self.query_one("#rename-error", Label).update("")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.rename()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "rename-go":
            self.rename()
        else:
            self.dismiss(None)

    def rename(self, shadow: bool = False) -> None:
        """Rename, or show the one-line reason why not; a built-in's name is asked about first."""
        from grpo_tui.dashboard.screens.confirm import ConfirmScreen

        new = self.new_name
        if new == self.old:
            self.dismiss(None)
            return
        try:
            rename_user_preset(self.old, new, shadow=shadow)
        except PresetError as exc:
            if not shadow and exc.lines == [builtin_name_message(new)]:
                question = f"Use {new} in place of the built-in preset {new}?"
                detail = f"Yours hides the built-in until it is deleted or renamed; {self.old} is renamed."
                self.app.push_screen(
                    ConfirmScreen(question, detail, yes="Shadow"), lambda yes: self.rename(shadow=True) if yes else None
                )
                return
            self._refuse(exc.lines[0])
            return
        except OSError as exc:  # an unwritable or vanished presets folder: say so, keep the app
            self._refuse(f"{exc.filename or self.old}: {exc.strerror or exc}")
            return
        self.dismiss(new)

    def _refuse(self, line: str) -> None:
        self.query_one("#rename-error", Label).update(Text(line, "red"))

    def action_cancel(self) -> None:
        self.dismiss(None)
