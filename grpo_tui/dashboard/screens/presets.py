"""The start screen: presets on the left, the selected one's fields and launch command on the right,
the runs found in the runs folder below."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, OptionList, Static
from textual.widgets.option_list import Option

from grpo_tui.config import schema, store
from grpo_tui.config.schema import Preset
from grpo_tui.dashboard.messages import CompareRequested, OpenRunRequested, RunRequested, ShowRunsRequested
from grpo_tui.dashboard.paths import shown_path
from grpo_tui.dashboard.runs_location import runs_location, runs_title
from grpo_tui.dashboard.widgets.runs_table import RunsTable
from grpo_tui.dashboard.workers import call_from_worker, while_mounted


def preset_fields_table(preset: Preset) -> Table:
    """Every field of `preset` by section; values that differ from the schema default are bold."""
    default = Preset().model_dump(mode="json")
    data = preset.model_dump(mode="json")
    table = Table(box=None, expand=True, show_header=False, pad_edge=False, padding=(0, 1))
    # The key column is as wide as its longest key (never broken mid-word); values wrap at spaces.
    keys = [key for values in data.values() if isinstance(values, dict) for key in values]
    table.add_column("key", style="dim", no_wrap=True, min_width=2 + max(map(len, keys), default=0))
    table.add_column("value", ratio=1, overflow="fold")
    for section, values in data.items():
        if not isinstance(values, dict):
            continue
        table.add_row(Text(f"[{section}]", style="bold cyan"), "")
        for key, value in values.items():
            changed = default.get(section, {}).get(key) != value
            table.add_row(f"  {key}", Text(_show(value), style="bold" if changed else ""))
    return table


def _show(value: object) -> str:
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return ", ".join(f"{v.get('name')}×{v.get('weight')}" for v in value)
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "[]"
    return "—" if value is None else str(value)


def launch_preview(preset: Preset, runs_dir: Path) -> str:
    """The exact command the runner will launch for this preset (run folder name filled at start)."""
    from grpo_tui.launch import command as launch

    run_dir = _relative(Path(runs_dir).resolve() / f"<YYYYmmdd-HHMMSS>-{preset.name}")
    return launch.format_command(launch.build_launch_command(preset, run_dir), launch.launch_env(preset))


def origin_label(entry: store.PresetEntry) -> str:
    """Where a preset comes from: built-in, user, or a user preset used in place of a built-in."""
    return "user (shadows built-in)" if entry.shadows_builtin else entry.origin


def _relative(path: Path) -> Path:
    # Shorter to read; the runner passes the absolute form of the same path.
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


class PresetScreen(Screen[None]):
    """Pick a preset and start it; `e` edits, `d` deletes and `n` renames a user preset, Enter/`s`
    starts, the runs table re-attaches."""

    BINDINGS = [
        Binding("s", "start", "Start", id="presets.start"),
        Binding("enter", "enter", "Start / open", priority=True, id="presets.enter"),
        Binding("e", "edit", "Edit", id="presets.edit"),
        Binding("u", "tune", "Tune", show=False, id="presets.tune"),
        Binding("d", "delete", "Delete", id="presets.delete"),
        Binding("n", "rename", "Rename", show=False, id="presets.rename"),
        Binding("r", "runs", "Runs", id="presets.runs"),
        Binding("c", "compare", "Compare", id="presets.compare"),
        Binding("f5", "reload", "Reload", id="presets.reload"),
    ]

    def __init__(self, select: str | None = None) -> None:
        super().__init__()
        self._select = select or store.DEFAULT_PRESET
        self.entries: list[store.PresetEntry] = []
        self.presets: dict[str, Preset] = {}
        self.errors: dict[str, list[str]] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="presets-top"):
            with Vertical(id="preset-list-box", classes="box") as box:
                box.border_title = "Presets"
                yield OptionList(id="preset-list")
            with Vertical(id="preset-detail-box", classes="box") as box:
                box.border_title = "Preset"
                with VerticalScroll(id="preset-detail-scroll"):
                    # The checks first: whether `s` will start it must show in the smallest terminal.
                    yield Static(id="preset-checks")
                    yield Static(id="preset-description")
                    yield Static(id="preset-fields")
                with VerticalScroll(id="preset-command-box") as cmd:  # scrolls in a short terminal
                    cmd.border_title = "Command that will run"
                    yield Static(id="preset-command")
        with Vertical(id="runs-box", classes="box") as box:
            box.border_title = runs_title(self.app)
            yield RunsTable(id="runs-table")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Presets"
        self.load_presets()
        self.query_one("#preset-list", OptionList).focus()

    def load_presets(self) -> None:
        """Read every preset (they are small TOML files); invalid ones stay listed with their errors."""
        self.entries = store.list_presets()
        self.presets.clear()
        self.errors.clear()
        for entry in self.entries:
            try:
                self.presets[entry.name] = store.load_preset_file(entry.path)
            except schema.PresetError as exc:
                self.errors[entry.name] = exc.lines
        options = self.query_one("#preset-list", OptionList)
        options.clear_options()
        for entry in self.entries:
            # Built-in is the rule; only a user preset says where it comes from (narrow lists stay one line).
            origin = "  " + origin_label(entry) if entry.origin == "user" else ""
            label = Text.assemble((entry.name, "bold" if entry.name in self.presets else "red"), (origin, "dim"))
            options.add_option(Option(label, id=entry.name))
        names = [e.name for e in self.entries]
        if names:
            options.highlighted = names.index(self._select) if self._select in names else 0

    @property
    def selected_entry(self) -> store.PresetEntry | None:
        options = self.query_one("#preset-list", OptionList)
        if options.highlighted is None or not self.entries:
            return None
        return self.entries[options.highlighted]

    @property
    def selected_name(self) -> str | None:
        entry = self.selected_entry
        return entry.name if entry is not None else None

    @property
    def selected_preset(self) -> Preset | None:
        name = self.selected_name
        return self.presets.get(name) if name else None

    @on(OptionList.OptionHighlighted, "#preset-list")
    def _show_selected(self, event: OptionList.OptionHighlighted) -> None:
        name = str(event.option.id)
        self._select = name
        entry = next(e for e in self.entries if e.name == name)
        box = self.query_one("#preset-detail-box")
        box.border_title = f"{name} · {origin_label(entry)}"
        box.border_subtitle = "built-in" if entry.origin == "built-in" else shown_path(entry.path)
        preset = self.presets.get(name)
        if preset is None:
            self.query_one("#preset-description", Static).update(Text("This preset does not validate:", "bold red"))
            self.query_one("#preset-fields", Static).update(Text("\n".join(self.errors.get(name, [])), "red"))
            self.query_one("#preset-checks", Static).update("")
            self.query_one("#preset-command", Static).update("")
            return
        self.query_one("#preset-description", Static).update(Text(preset.description or "(no description)", "italic"))
        self.query_one("#preset-fields", Static).update(preset_fields_table(preset))
        runs_dir = runs_location(self.app).launch_dir(preset)
        self.query_one("#preset-command", Static).update(Text(launch_preview(preset, runs_dir)))
        self.query_one("#preset-checks", Static).update(Text("checking…", "dim"))
        self._check(preset)

    @work(thread=True, exclusive=True, group="preset-check")
    def _check(self, preset: Preset) -> None:
        # Checks may import the reward registry or query NVML: keep them off the UI thread.
        from grpo_tui.config import checks

        result = checks.check_preset(preset)
        lines = [Text("✗ " + e, "red") for e in result.errors] + [Text("• " + n, "dim") for n in result.notes]
        text = Text("\n").join(lines) if lines else Text("✓ all pre-launch checks pass", "green")
        call_from_worker(self, self._show_checks, text)

    @while_mounted
    def _show_checks(self, text: Text) -> None:
        self.query_one("#preset-checks", Static).update(text)

    def on_data_table_row_selected(self) -> None:
        # Enter is the screen's (priority) binding, so this comes from a mouse click on a run's row.
        self._open_run(self.query_one(RunsTable))

    def on_screen_resume(self) -> None:
        # Back from a dashboard or the editor: runs may have started or ended meanwhile.
        self.query_one(RunsTable).refresh_runs()
        self.query_one("#runs-box").border_title = runs_title(self.app)

    def action_enter(self) -> None:
        focused = self.focused
        if isinstance(focused, RunsTable):
            self._open_run(focused)
        else:
            self.action_start()

    def _open_run(self, table: RunsTable) -> None:
        run = table.selected
        if run is not None:
            self.post_message(OpenRunRequested(run.path))

    def action_start(self) -> None:
        name = self.selected_name
        if name is None:
            return
        preset = self.presets.get(name)
        if preset is None:
            self.notify(
                "\n".join(self.errors.get(name, ["invalid preset"])), title=f"{name} is invalid", severity="error"
            )
            return
        self.post_message(RunRequested(preset))

    def action_edit(self) -> None:
        from grpo_tui.dashboard.screens.preset_editor import PresetEditorScreen

        preset, entry = self.selected_preset, self.selected_entry
        if preset is None or entry is None:
            self.notify("Pick a valid preset to edit (invalid files: fix them in an editor).", severity="warning")
            return
        self.app.push_screen(PresetEditorScreen(preset, entry.origin), self._after_edit)

    def _after_edit(self, saved_name: str | None) -> None:
        if saved_name:
            self._select = saved_name
            self.load_presets()

    def action_tune(self) -> None:
        from grpo_tui.dashboard.screens.tune import TuneScreen

        name = self.selected_name
        if name is not None:
            self.app.push_screen(TuneScreen(name))

    def action_delete(self) -> None:
        from grpo_tui.dashboard.screens.confirm import ConfirmScreen

        entry = self.selected_entry
        if entry is None:
            return
        if entry.origin != "user":
            self.notify(f"{entry.name} is built-in (read-only); only user presets can be deleted.", severity="warning")
            return
        shadowed = " The built-in preset of this name shows again." if entry.shadows_builtin else ""
        self.app.push_screen(
            ConfirmScreen(
                f"Delete user preset {entry.name}?", f"{shown_path(entry.path)} is removed.{shadowed}", "Delete"
            ),
            lambda yes: self._delete(entry.name) if yes else None,
        )

    def _delete(self, name: str) -> None:
        try:
            path = store.delete_user_preset(name)
        except schema.PresetError as exc:
            self.notify(exc.lines[0], title="Not deleted", severity="error")
            return
        self.notify(f"Deleted {shown_path(path)}", title=f"Preset {name}")
        self.load_presets()

    def action_rename(self) -> None:
        from grpo_tui.dashboard.screens.rename import RenamePresetScreen

        entry = self.selected_entry
        if entry is None:
            return
        if entry.origin != "user":
            self.notify(f"{entry.name} is built-in (read-only); only user presets can be renamed.", severity="warning")
            return
        self.app.push_screen(RenamePresetScreen(entry.name), lambda new: self._renamed(entry.name, new))

    def _renamed(self, old: str, new: str | None) -> None:
        if not new:
            return
        self.notify(f"Renamed {old} to {new}", title=f"Preset {new}")
        self._select = new
        self.load_presets()

    def action_runs(self) -> None:
        self.post_message(ShowRunsRequested())

    def action_compare(self) -> None:
        self.post_message(CompareRequested())

    def action_reload(self) -> None:
        self.load_presets()
        self.query_one(RunsTable).refresh_runs()
