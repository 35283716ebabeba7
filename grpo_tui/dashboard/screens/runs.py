"""Every run in the runs folder with its status; open one (re-attach when it is running) or mark two
and compare them."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from grpo_tui.dashboard.messages import CompareRequested, OpenRunRequested
from grpo_tui.dashboard.runs_location import runs_title
from grpo_tui.dashboard.widgets.runs_table import RunsTable

HINT = "Enter open · space mark (two marked: c compares them) · f5 refresh · Escape back"


class RunsScreen(Screen[None]):
    BINDINGS = [
        Binding("enter", "open", "Open dashboard", priority=True, id="runs.open"),
        Binding("space", "mark", "Mark for compare", id="runs.mark"),
        Binding("c", "compare", "Compare marked", id="runs.compare"),
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

    def action_refresh(self) -> None:
        self.query_one(RunsTable).refresh_runs()

    def action_back(self) -> None:
        self.dismiss(None)
