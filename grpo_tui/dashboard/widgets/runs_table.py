"""The runs found in a runs folder, with status, kept live; Enter (or a click) opens one's dashboard."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual import work
from textual.message import Message
from textual.widgets import DataTable

from grpo_tui.dashboard.runs_location import runs_location
from grpo_tui.dashboard.runs_watch import RunsWatcher
from grpo_tui.runs.listing import RunInfo
from grpo_tui.runs.model_dir import human_bytes
from grpo_tui.runs.status import status_style

# Seconds between looks at the runs folder (a stat per file; only changed runs are re-read).
REFRESH_S = 1.0


class RunsTable(DataTable):
    """Scans in a thread worker, about once a second while its screen shows; `marked` runs (space)
    feed the compare screen. `action` is the word its box's subtitle gives Enter ("opens")."""

    @dataclass
    class Scanned(Message):
        """A scan of the runs folder found changes."""

        runs: list[RunInfo]

    def __init__(self, *, action: str = "opens", id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self.action = action
        self.runs: list[RunInfo] = []
        self.marked: list[Path] = []
        self.watcher = RunsWatcher()
        self._scanning = False

    def on_mount(self) -> None:
        self.add_column("", key="mark", width=1)
        self.add_column("run", key="run")
        self.add_column("preset", key="preset")
        self.add_column("status", key="status")
        self.add_column("step", key="step")
        # The last step's reward; Compare's "final reward" is the mean of the last steps, another figure.
        self.add_column("last reward", key="reward")
        self.add_column("loss", key="loss")
        self.add_column("impl", key="impl")
        self.add_column("disk", key="disk")
        self.add_column("started", key="started")
        self.set_interval(REFRESH_S, self._tick)

    def refresh_runs(self, force: bool = True) -> None:
        """Look at the runs folder again (`force`: re-read every run, as f5 does). Its screen calls
        this when it shows (ScreenResume); the timer keeps the list live after that."""
        if self._scanning and not force:
            return
        self._scanning = True
        self._scan(runs_location(self.app).path, force)

    def _tick(self) -> None:
        # Only while its screen is the one on show; the next look starts after the last one ended.
        if self.screen.is_current:
            self.refresh_runs(force=False)

    @work(thread=True, exclusive=True, group="runs-scan")
    def _scan(self, runs_dir: Path, force: bool) -> None:
        try:
            runs = self.watcher.scan(runs_dir, force=force)
        finally:
            self._scanning = False
        if runs is not None:
            self.post_message(self.Scanned(runs))

    def on_runs_table_scanned(self, message: Scanned) -> None:
        message.stop()
        keep = self.selected.path if self.selected is not None else None
        self.runs = message.runs
        self.clear()
        for run in self.runs:
            self.add_row(*self._cells(run), key=str(run.path))
        paths = [run.path for run in self.runs]
        if self.runs:  # the cursor stays on its run when a new one appears above it
            self.move_cursor(row=paths.index(keep) if keep in paths else min(self.cursor_row, len(paths) - 1))
        if self.parent is not None:  # the box around the table says what to do
            self.parent.border_subtitle = (
                f"{len(self.runs)} run(s) · Enter {self.action}"
                if self.runs
                else "no runs yet · s starts the selected preset"
            )

    def _cells(self, run: RunInfo) -> list[Text | str]:
        started = time.strftime("%m-%d %H:%M", time.localtime(run.started)) if run.started else "—"
        reward = f"{run.last_reward:.3f}" if run.last_reward is not None else "—"
        loss = f"{run.last_loss:.4f}" if run.last_loss is not None else "—"
        return [
            self._mark_cell(run.path),
            run.name,
            run.preset,
            Text(run.status, status_style(run.status)),
            str(run.steps),
            reward,
            loss,
            run.loss_impl or "—",
            human_bytes(run.disk_bytes),
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
