"""Edit a preset in a form: one input per field, validated as you type by the runner's own schema
and its pre-launch cross-field checks; save as a new user preset, or over a user preset (after a
confirm). Built-in presets are read-only.

The schema runs at each keystroke on the UI thread (pydantic, fast). The cross-field checks may read
the data's first row or import a `module:function` reward, so they run in a thread worker once typing
has paused for CHECK_DELAY_S; their errors join the form's when they arrive (`Checked`). Saving runs
them at once when the last result is not for the form as it stands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header, Input, Label, Select, Static, Switch
from textual.worker import get_current_worker

from grpo_tui.config import checks, schema, store
from grpo_tui.config.schema import PRESET_NAME_RE, Preset, format_errors, walk_fields
from grpo_tui.config.schema_walk import literal_choices

# Seconds of quiet after a keystroke before the cross-field checks run: one run per pause, not per key.
CHECK_DELAY_S = 0.3


def _is_bool(annotation: Any) -> bool:
    return annotation is bool


def _text_of(value: Any) -> str:
    """Form text of a value: lists comma-separated, reward specs as name=weight."""
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(f"{v['name']}={v['weight']}" if isinstance(v, dict) else str(v) for v in value)
    return str(value)


def _value_of(text: str, current: Any, dotted: str) -> Any:
    """Turn form text back into data for pydantic (which then coerces and validates it)."""
    text = text.strip()
    if dotted == "rewards.functions":
        specs = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, weight = part.partition("=")
            specs.append({"name": name.strip(), "weight": weight.strip() or 1.0})
        return specs
    if isinstance(current, list):
        return [p.strip() for p in text.split(",") if p.strip()]
    if text == "":
        return "" if isinstance(current, str) else None
    return text


class PresetEditorScreen(Screen[str | None]):
    """The form; dismisses with the saved preset's name (None when cancelled)."""

    BINDINGS = [
        Binding("ctrl+s", "save", "Save user preset", priority=True, id="editor.save"),
        Binding("escape", "cancel", "Cancel", id="editor.cancel"),
        # q outside a text field must not quit the app and lose the form.
        Binding("q", "hold_quit", "Quit (after the editor)", show=False, id="editor.quit"),
    ]

    @dataclass
    class Checked(Message):
        """The cross-field checks of `preset` ended in a worker with these errors."""

        preset: Preset
        errors: list[str]

    def __init__(self, preset: Preset, origin: store.Origin = "built-in") -> None:
        super().__init__()
        self.preset = preset
        self.origin = origin
        self.data = preset.model_dump(mode="json")
        self.valid: Preset | None = preset
        self.hints: dict[str, str] = {}  # widget id -> the field's description, shown when valid
        self.checked: tuple[Preset, list[str]] | None = None  # the last cross-field result and its preset
        self._check_timer: Timer | None = None
        # Read once: validation runs on every keystroke, on the UI thread, and must not scan folders.
        entries = store.list_presets()
        self.builtin_names = {e.name for e in entries if e.origin == "built-in"}
        self.user_names = {e.name for e in entries if e.origin == "user"}

    @property
    def overwrites(self) -> bool:
        """Saving now replaces an existing user preset (asked first)."""
        return self.valid is not None and self.valid.name in self.user_names

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="editor-form"):
            yield Static(
                Text.assemble(
                    ("Editing ", "dim"),
                    (self.preset.name, "bold"),
                    (f" ({self.origin})  ·  values are checked as you type; ctrl+s saves a user preset", "dim"),
                )
            )
            # A built-in is read-only: propose a copy. A user preset is saved over itself by default.
            name = self.preset.name if self.origin == "user" else f"{self.preset.name}-custom"
            yield from self._row("name", "name", name, str)
            yield from self._row("description", "description", self.preset.description, str)
            # `name`/`description` are above; every section's fields follow, in the schema's order.
            for field in walk_fields(Preset):
                section, _, key = field.path.rpartition(".")
                if field.section is not None:
                    yield Label(Text(f"[{field.path}]"), classes="form-section")  # Text: brackets are not markup
                elif section:
                    value = self.data[section][key]
                    yield from self._row(field.path, key, value, field.annotation, field.info.description or "")
        yield Static(id="editor-status")
        yield Footer()

    def _row(self, dotted: str, label: str, value: Any, annotation: Any, hint: str = "") -> ComposeResult:
        widget_id = "f-" + dotted.replace(".", "--")
        with Horizontal(classes="form-row"):
            yield Label(label, classes="form-label")
            choices = literal_choices(annotation)
            if _is_bool(annotation):
                yield Switch(value=bool(value), id=widget_id, classes="form-field")
            elif choices is not None and not isinstance(value, list):
                options = [(str(c), c) for c in choices]
                yield Select(options, value=value, allow_blank=False, id=widget_id, classes="form-field")
            else:
                yield Input(_text_of(value), id=widget_id, classes="form-field", tooltip=hint or None)
            self.hints[widget_id] = hint
            yield Label(Text(hint, "dim"), id=f"err-{widget_id}", classes="form-error")

    def _collect(self) -> dict[str, Any]:
        data = self.preset.model_dump(mode="json")
        data["name"] = self.query_one("#f-name", Input).value.strip()
        data["description"] = self.query_one("#f-description", Input).value
        for section in schema.SECTIONS:
            for key, current in data[section].items():
                widget = self.query_one(f"#f-{section}--{key}")
                if isinstance(widget, Switch):
                    data[section][key] = widget.value
                elif isinstance(widget, Select):
                    data[section][key] = widget.value
                elif isinstance(widget, Input):
                    data[section][key] = _value_of(widget.value, current, f"{section}.{key}")
        return data

    def validate_form(self) -> list[str]:
        """Validate everything now, the cross-field checks included (on this thread, unless the last
        worker result is for this very form); put each error beside its field; return all error lines."""
        return self._validate(wait=False)

    def _validate(self, wait: bool) -> list[str]:
        """The schema now; the cross-field checks from the last result when it is for this form, else
        run now, or (`wait`) left to a worker after CHECK_DELAY_S of quiet."""
        for label in self.query(".form-error").results(Label):
            label.update(Text(self.hints.get(str(label.id)[4:], ""), "dim"))
        self.valid = None
        data = self._collect()
        errors: list[str] = []
        try:
            self.valid = Preset.model_validate(data)
        except ValidationError as exc:
            errors = format_errors(exc)
            for item, line in zip(exc.errors(), errors):
                loc = [str(p) for p in item["loc"] if not isinstance(p, int)]
                self._show_error(loc, line.split(": ", 1)[-1])
        pending = False
        if self.valid is not None:  # the start refuses what these refuse: say so before saving
            if self.checked is not None and self.checked[0] == self.valid:
                errors += self._show_cross_field(self.checked[1])
            elif wait:
                pending = True
                self._schedule_checks(self.valid)
            else:
                found = checks.check_preset(self.valid, environment=False).errors
                self.checked = (self.valid, found)
                errors += self._show_cross_field(found)
        if not pending and self._check_timer is not None:
            self._check_timer.stop()  # nothing is left for a worker to check (schema errors, or known)
        name = data["name"]
        # The schema already checks the name's characters; a clash with a built-in is ours to refuse.
        if PRESET_NAME_RE.match(name or "") and name in self.builtin_names:
            errors.append(f"name: {name!r} is a built-in preset (read-only); pick a new name")
            self.query_one("#err-f-name", Label).update(Text("a built-in has this name", "red"))
        elif name in self.user_names:
            self.query_one("#err-f-name", Label).update(Text("saving replaces this user preset", "yellow"))
        status = self.query_one("#editor-status", Static)
        saves = f"replaces user preset {name} (asks first)" if self.overwrites else "saves it as a new user preset"
        if errors:
            status.update(Text(f"✗ {len(errors)} problem(s): " + errors[0], "red"))
        elif pending:
            status.update(Text(f"… checking — ctrl+s {saves}", "dim"))
        else:
            status.update(Text(f"✓ valid — ctrl+s {saves}", "green"))
        return errors

    def _show_cross_field(self, errors: list[str]) -> list[str]:
        """Put each of `check_preset`'s errors beside its field; return them."""
        for line in errors:
            dotted, _, reason = line.partition(": ")
            self._show_error(dotted.split("."), reason)
        return errors

    def _schedule_checks(self, preset: Preset) -> None:
        # Each keystroke restarts the wait: the checks run once typing pauses.
        if self._check_timer is not None:
            self._check_timer.stop()
        self._check_timer = self.set_timer(CHECK_DELAY_S, lambda: self._run_checks(preset))

    @work(thread=True, exclusive=True, group="editor-checks")
    def _run_checks(self, preset: Preset) -> None:
        # Machine-independent only: this form may be for another machine.
        errors = checks.check_preset(preset, environment=False).errors
        if not get_current_worker().is_cancelled:  # a newer form's checks replaced these
            self.post_message(self.Checked(preset, errors))

    def on_preset_editor_screen_checked(self, message: Checked) -> None:
        message.stop()
        if message.preset != self.valid:
            return  # typed on meanwhile: the newer form's checks are coming
        self.checked = (message.preset, message.errors)
        self._validate(wait=True)

    def _show_error(self, loc: list[str], reason: str) -> None:
        for depth in (2, 1):  # a reward spec's error (rewards.functions.0.name) belongs to rewards.functions
            target = self.query(f"#err-f-{'--'.join(loc[:depth])}")
            if target:
                target.first(Label).update(Text(reason, "red"))
                return

    @on(Input.Changed)
    @on(Select.Changed)
    @on(Switch.Changed)
    def _changed(self) -> None:
        self._validate(wait=True)

    def on_mount(self) -> None:
        self.sub_title = f"Edit {self.preset.name}"
        self._validate(wait=True)
        self.query_one("#f-name", Input).focus()

    def action_save(self) -> None:
        errors = self.validate_form()
        if errors or self.valid is None:
            self.notify(errors[0] if errors else "invalid preset", title="Not saved", severity="error")
            return
        preset = self.valid
        if not self.overwrites:
            self._save(preset, overwrite=False)
            return
        from grpo_tui.dashboard.screens.confirm import ConfirmScreen

        path = store.user_presets_dir() / f"{preset.name}.toml"
        self.app.push_screen(
            ConfirmScreen(f"Replace user preset {preset.name}?", f"{path} is overwritten.", yes="Replace"),
            lambda yes: self._save(preset, overwrite=True) if yes else None,
        )

    def _save(self, preset: Preset, overwrite: bool) -> None:
        try:
            path = store.save_user_preset(preset, preset.name, overwrite=overwrite)
        except schema.PresetError as exc:
            self.notify(exc.lines[0], title="Not saved", severity="error")
            return
        self.notify(f"Saved {path}", title=f"Preset {preset.name}")
        self.dismiss(preset.name)

    def action_hold_quit(self) -> None:
        self.notify("Save with ctrl+s or leave with Esc first; then q quits.", severity="warning")

    def action_cancel(self) -> None:
        self.dismiss(None)
