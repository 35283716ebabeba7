"""`u` on the presets screen: tune a preset for a memory cap, trials shown live.

The search is `grpo-tui tune PRESET --jsonl` in a child process (the dashboard may not import tools,
and a process of its own keeps the app responsive and its memory out of the trials' way); a thread
worker reads one JSON object per trial and posts it to the screen. Inputs are checked by that command,
whose one-line error is shown as is.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Label, ProgressBar, Static

from grpo_tui.launch.process_group import signal_group
from grpo_tui.userinput import clip

HINT = "Enter in a field starts the search · Escape stops it and goes back"
DEFAULT_BUDGET_MIN = "30"  # the command's default, shown so the user sees what applies


def tune_command(preset: str, cap: str, budget: str) -> list[str]:
    """The child process's argv: the same search as `grpo-tui tune`, reporting in JSON lines. Trial
    runs go where that command puts them (./tune-runs), apart from the real runs the app lists."""
    return [
        sys.executable,
        "-m",
        "grpo_tui.cli",
        "tune",
        preset,
        "--memory-cap",
        cap,
        "--time-budget",
        budget,
        "--jsonl",
    ]


def form_problem(field: str, text: str, unit: str) -> str | None:
    """Why `text` is not a positive number for `field` (one line), or None."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if value > 0 and math.isfinite(value):
        return None
    return f"{field}: got {clip(text, 40)!r}; allowed: a positive number of {unit}"


class TuneScreen(Screen[None]):
    """Search the fastest settings of one preset under a memory cap; every trial appears as it ends."""

    DEFAULT_CSS = """
    TuneScreen #tune-inputs { height: auto; padding: 0 1; }
    TuneScreen #tune-inputs Label { padding: 1 1 0 0; }
    TuneScreen #tune-inputs Input { width: 16; }
    TuneScreen #tune-status { height: auto; padding: 0 1; }
    TuneScreen ProgressBar { padding: 0 1; }
    """
    BINDINGS = [Binding("escape", "back", "Stop and back", id="tune.back")]

    @dataclass
    class Event(Message):
        """One JSON line of the search: {"columns": [...]}, then {"trial": ..., "row": [...]}, then {"done": ...}."""

        data: dict[str, Any]

    @dataclass
    class Ended(Message):
        """The search process exited; `error` is its last stderr line when it failed."""

        code: int
        error: str

    def __init__(self, preset: str) -> None:
        super().__init__()
        self.preset = preset
        self._process: subprocess.Popen[str] | None = None
        self._started = 0.0
        self._budget_s = 0.0
        self.exit_code: int | None = None  # the last search's, once it has ended

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="tune-inputs"):
            yield Label("memory cap (GiB)")
            yield Input(placeholder="e.g. 24", id="tune-cap")
            yield Label("time budget (min)")
            yield Input(DEFAULT_BUDGET_MIN, id="tune-budget")
        yield Static("Give a memory cap and press Enter.", id="tune-status")
        yield ProgressBar(total=None, show_eta=False, id="tune-progress")
        with Vertical(classes="box") as box:
            box.border_title = f"Trials of {self.preset}"
            yield DataTable(id="tune-trials", cursor_type="row", zebra_stripes=True)
        yield Static(HINT, classes="hint")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"Tune {self.preset}"
        self.query_one("#tune-cap", Input).focus()
        self.set_interval(1.0, self._tick)

    @on(Input.Submitted)
    def start(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self.notify("A search is running; Escape stops it.", severity="warning")
            return
        cap = self.query_one("#tune-cap", Input).value.strip()
        budget = self.query_one("#tune-budget", Input).value.strip() or DEFAULT_BUDGET_MIN
        if not cap:
            self._status("A memory cap is needed, in GiB (e.g. 24).")
            return
        problem = form_problem("memory cap", cap, "GiB (e.g. 24)") or form_problem("time budget", budget, "minutes")
        if problem:  # one line in the form, as the editor does, not the command's usage text
            self._status(problem)
            return
        self._budget_s = float(budget) * 60
        self._started = time.monotonic()
        self.exit_code = None
        self._status(f"Searching under {cap} GiB…")
        self._search(tune_command(self.preset, cap, budget))

    @work(thread=True, exclusive=True, group="tune")
    def _search(self, argv: list[str]) -> None:
        # Its own session: Escape stops the search and, through its supervisor, the trial it is running.
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        self._process = process
        assert process.stdout is not None and process.stderr is not None  # both are pipes
        for line in process.stdout:
            try:
                self.post_message(self.Event(json.loads(line)))
            except json.JSONDecodeError:
                continue  # not an event (a stray print): the table only shows trials
        error = process.stderr.read().strip().splitlines()
        self.post_message(self.Ended(process.wait(), error[-1] if error else ""))

    def on_tune_screen_event(self, event: Event) -> None:
        table = self.query_one(DataTable)
        if "columns" in event.data:  # the command's table heading comes first
            table.clear(columns=True)
            table.add_columns(*event.data["columns"])
        elif "trial" in event.data:
            table.add_row(*event.data.get("row", ()))
        elif "done" in event.data:
            self._status(str(event.data["done"].get("message", "")))

    def on_tune_screen_ended(self, event: Ended) -> None:
        self._process = None
        self._budget_s = 0.0
        self.exit_code = event.code
        self.query_one(ProgressBar).update(total=1, progress=1)
        if event.code not in (0, 1):  # 0 and 1 (nothing fits) sent their verdict as the last event
            self._status(event.error or f"the search stopped (exit code {event.code})")

    def _tick(self) -> None:
        if self._process is not None and self._budget_s > 0:
            elapsed = time.monotonic() - self._started
            self.query_one(ProgressBar).update(total=self._budget_s, progress=min(elapsed, self._budget_s))

    def _status(self, text: str) -> None:
        self.query_one("#tune-status", Static).update(text)

    def stop(self) -> None:
        """End the search process group (the trial's supervisor stops its training processes)."""
        process = self._process
        if process is not None and process.poll() is None:
            signal_group(process.pid, signal.SIGTERM)  # a group that just ended is fine

    def on_unmount(self) -> None:
        self.stop()

    def action_back(self) -> None:
        self.stop()
        self.dismiss(None)
