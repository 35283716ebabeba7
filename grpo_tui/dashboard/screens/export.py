"""The export dialog (e on a run's dashboard): where to write the model, merged or not, in which dtype."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select

from grpo_tui.launch.export import ExportOptions
from grpo_tui.userinput import user_path

DTYPE_CHOICES = [("as trained", ""), ("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32")]


def default_target(run_path: Path) -> Path:
    """Beside the runs folder: exports/<run name>, so a runs --delete never takes an export with it."""
    return Path(run_path).parent.parent / "exports" / Path(run_path).name


class ExportScreen(ModalScreen[ExportOptions | None]):
    """Dismisses with the chosen options (Enter / Export) or None (Escape / Cancel)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="export.cancel")]

    def __init__(self, run_path: Path, lora: bool) -> None:
        super().__init__()
        self.run_path = Path(run_path)
        self.lora = lora

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog"):
            yield Label(f"Export the model of {self.run_path.name}", classes="dialog-title")
            yield Label("Folder to write (new or empty):", classes="dialog-detail")
            yield Input(str(default_target(self.run_path)), id="export-to")
            merge_hint = "merge the LoRA adapter into its base (no peft needed)"
            yield Checkbox(merge_hint, value=self.lora, id="export-merged", disabled=not self.lora)
            yield Checkbox("replace an earlier export in that folder", id="export-force")
            yield Select(DTYPE_CHOICES, value="", allow_blank=False, id="export-dtype", prompt="dtype")
            with Horizontal(classes="dialog-buttons"):
                yield Button(escape("Export [Enter]"), id="export-go", variant="primary")
                yield Button(escape("Cancel [Esc]"), id="export-cancel")

    def on_mount(self) -> None:
        self.query_one("#export-to", Input).focus()

    def options(self) -> ExportOptions | None:
        """The dialog's fields, or None (and a note) when the folder field is empty."""
        text = self.query_one("#export-to", Input).value.strip()
        if not text:
            self.notify("Give the folder to write the model to.", severity="warning")
            return None
        dtype = self.query_one("#export-dtype", Select).value
        return ExportOptions(
            to=user_path(text),
            merged=self.lora and self.query_one("#export-merged", Checkbox).value,
            dtype=str(dtype) if isinstance(dtype, str) and dtype else None,
            force=self.query_one("#export-force", Checkbox).value,
        )

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._go()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "export-go":
            self._go()
        else:
            self.dismiss(None)

    def _go(self) -> None:
        options = self.options()
        if options is not None:
            self.dismiss(options)

    def action_cancel(self) -> None:
        self.dismiss(None)
