"""Every run in the runs folder with its status; open one (re-attach when it is running) or mark two
and compare them."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from grpo_tui.dashboard.messages import CompareRequested, OpenRunRequested
from grpo_tui.dashboard.runs_location import runs_title
from grpo_tui.dashboard.widgets.runs_table import RunsTable

HINT = (
    "Enter open · space mark (two marked: c compares them) · p prune checkpoints · D delete · f5 refresh · Escape back"
)


class RunsScreen(Screen[None]):
    BINDINGS = [
        Binding("enter", "open", "Open dashboard", priority=True, id="runs.open"),
        Binding("space", "mark", "Mark for compare", id="runs.mark"),
        Binding("c", "compare", "Compare marked", id="runs.compare"),
        Binding("p", "tidy(False)", "Prune checkpoints", id="runs.prune"),
        Binding("D", "tidy(True)", "Delete run", id="runs.delete"),
        Binding("f5", "refresh", "Refresh", id="runs.refresh"),
        Binding("escape", "back", "Back", id="runs.back"),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="runs-screen-box", classes="box") as box:
            box.border_title = runs_title(self.app)
            yield RunsTable(id="runs-screen-table")
        yield Static(HINT, id="runs-hint", classes="hint")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Runs"
        self.query_one(RunsTable).focus()

    def on_data_table_row_selected(self) -> None:
        # Enter is the screen's (priority) binding, so this comes from a mouse click on a row.
        self.action_open()

    def on_screen_resume(self) -> None:
        self.query_one(RunsTable).refresh_runs()  # back from a dashboard: statuses may have changed

    def action_open(self) -> None:
        run = self.query_one(RunsTable).selected
        if run is not None:
            self.post_message(OpenRunRequested(run.path))

    def action_mark(self) -> None:
        self.query_one(RunsTable).toggle_mark()

    def action_compare(self) -> None:
        table = self.query_one(RunsTable)
        marked = list(table.marked)
        if len(marked) < 2 and table.selected is not None and table.selected.path not in marked:
            marked.append(table.selected.path)
        if len(marked) < 2:
            self.notify("Mark two runs with space first (or open compare and pick there).", severity="warning")
            return
        self.post_message(CompareRequested(marked[-2], marked[-1]))

    def action_tidy(self, delete: bool) -> None:
        """Delete the selected run, or prune its checkpoints (keeping model/), after a confirm."""
        from grpo_tui.dashboard.screens.confirm import ConfirmScreen
        from grpo_tui.runs.model_dir import folder_bytes, human_bytes

        run = self.query_one(RunsTable).selected
        if run is None:
            return
        what = run.path if delete else run.path / "checkpoints"
        if not what.exists():
            self.notify(f"{run.name} has no checkpoints to prune.", severity="warning")
            return
        question = f"Delete the run {run.name}?" if delete else f"Prune the checkpoints of {run.name}?"
        keeps = (
            "Everything in it goes."
            if delete
            else "model/, metrics and completions stay; resuming it will not be possible."
        )
        detail = f"{what} ({human_bytes(folder_bytes(what))}). {keeps}"

        def answered(yes: bool | None) -> None:
            if yes:
                self._tidy(run.path, delete)

        self.app.push_screen(ConfirmScreen(question, detail, yes="Delete" if delete else "Prune"), answered)

    def _tidy(self, path: Path, delete: bool) -> None:
        from grpo_tui.runs.housekeeping import HousekeepingError, delete_run, prune_run

        try:
            freed = delete_run(path) if delete else prune_run(path)
        except (HousekeepingError, OSError) as exc:
            self.notify(str(exc), severity="error")
            return
        self.notify(freed.line("Deleted" if delete else "Pruned"))
        self.query_one(RunsTable).refresh_runs()

    def action_refresh(self) -> None:
        self.query_one(RunsTable).refresh_runs()

    def action_back(self) -> None:
        self.dismiss(None)
