"""Where the app lists runs, read by screens and widgets through one typed accessor.

Screens ask the app to *do* things with messages (`messages.py`); this is the one piece of app state
they read. The app owns the `RunsLocation` and moves it when a run starts elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from grpo_tui.config.schema import Preset
from grpo_tui.dashboard.paths import shown_path


@dataclass
class RunsLocation:
    """The runs folder on show.

    Attributes:
        path: The folder listed (`--runs-dir`, else `./runs` until a run starts, then that run's parent).
        given: `--runs-dir` was given: every run goes there, whatever its preset's `logging.runs_dir`.
    """

    path: Path
    given: bool

    def launch_dir(self, preset: Preset) -> Path:
        """The folder a run of `preset` will be created in."""
        return self.path if self.given else Path(preset.logging.runs_dir)


@runtime_checkable
class RunsLocationHost(Protocol):
    """An app that shows runs (GrpoTuiApp); a Protocol so screens need not import the app module."""

    runs: RunsLocation


def runs_location(app: object) -> RunsLocation:
    """The runs location of `app`; a TypeError (a bug) when the app does not keep one."""
    if not isinstance(app, RunsLocationHost):
        raise TypeError(f"{type(app).__name__} keeps no runs location (screens expect GrpoTuiApp)")
    return app.runs


def runs_title(app: object) -> str:
    """The title of a box listing the runs: `Runs · runs` (the folder as the user would type it)."""
    return f"Runs · {shown_path(runs_location(app).path)}"
