"""The runs found in a runs folder, with status; Enter (or a click) opens one's dashboard."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual import work
from textual.message import Message
from textual.widgets import DataTable

from grpo_tui.dashboard.runs_location import runs_location
from grpo_tui.runs.listing import RunInfo, scan_runs
from grpo_tui.runs.status import status_style


class RunsTable(DataTable):
    """Scans in a thread worker; `marked` runs (space) feed the compare screen."""

    @dataclass
    class Scanned(Message):
        """A scan of the runs folder finished."""

        runs: list[RunInfo]

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self.runs: list[RunInfo] = []
        self.marked: list[Path] = []

    def on_mount(self) -> None:
        self.add_column("", key="mark", width=1)
        self.add_column("run", key="run")
        self.add_column("preset", key="preset")
        self.add_column("status", key="status")
        self.add_column("step", key="step")
        self.add_column("reward", key="reward")
        self.add_column("loss", key="loss")
        self.add_column("started", key="started")

    def refresh_runs(self) -> None:
        """Scan the runs folder again (its screen calls this when it shows: on ScreenResume)."""
        self._scan(runs_location(self.app).path)

    @work(thread=True, exclusive=True, group="runs-scan")
    def _scan(self, runs_dir: Path) -> None:
        self.post_message(self.Scanned(scan_runs(runs_dir)))

    def on_runs_table_scanned(self, message: Scanned) -> None:
        message.stop()
        self.runs = message.runs
        keep = self.cursor_row
        self.clear()
        for run in self.runs:
            self.add_row(*self._cells(run), key=str(run.path))
        if self.runs:
            self.move_cursor(row=min(keep, len(self.runs) - 1))
        if self.parent is not None:  # the box around the table says what to do
            self.parent.border_subtitle = (
                f"{len(self.runs)} run(s) · Enter opens" if self.runs else "no runs yet · s starts the selected preset"
            )

    def _cells(self, run: RunInfo) -> list[Text | str]:
        started = time.strftime("%m-%d %H:%M", time.localtime(run.started)) if run.started else "—"
        reward = f"{run.last_reward:.3f}" if run.last_reward is not None else "—"
        return [
            self._mark_cell(run.path),
            run.name,
            run.preset,
            Text(run.status, status_style(run.status)),
            str(run.steps),
            reward,
            run.loss_impl or "—",
            started,
        ]

    @property
    def selected(self) -> RunInfo | None:
        if not self.runs or self.cursor_row < 0 or self.cursor_row >= len(self.runs):
            return None
        return self.runs[self.cursor_row]

    def toggle_mark(self) -> None:
        """Mark / unmark the selected run for comparing (the two newest marks are kept)."""
        run = self.selected
        if run is None:
            return
        if run.path in self.marked:
            self.marked.remove(run.path)
        else:
            self.marked = (self.marked + [run.path])[-2:]
        for i, info in enumerate(self.runs):
            self.update_cell_at((i, 0), self._mark_cell(info.path))

    def _mark_cell(self, path: Path) -> Text | str:
        return Text("●", "bold magenta") if path in self.marked else ""
