"""App-wide messages: small past-tense events that cross screens.

Widget-specific messages live nested in their widget (e.g. `LossImplToggle.Toggled`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.message import Message

from grpo_tui.config.schema import Preset


@dataclass
class RunStarted(Message):
    """A run was prepared and its supervisor spawned (detached)."""

    run_path: Path
    pid: int | None


@dataclass
class RunStartFailed(Message):
    """Preparing or spawning a run failed; `reason` is one line for the user."""

    preset_name: str
    reason: str


@dataclass
class LossImplRequested(Message):
    """The user asked a run to switch its loss implementation (control.json written)."""

    run_path: Path
    loss_impl: str


@dataclass
class StopRequested(Message):
    """The user asked a run to stop; `force` kills its process group."""

    run_path: Path
    force: bool


# ---- requests from screens to the app (the app owns navigation and starting runs) ---------------


@dataclass
class RunRequested(Message):
    """The user asked to start `preset`; the app prepares and spawns the run."""

    preset: Preset


@dataclass
class OpenRunRequested(Message):
    """The user picked a run folder; the app opens its dashboard."""

    run_path: Path


@dataclass
class ShowRunsRequested(Message):
    """The user asked for the runs list."""


@dataclass
class CompareRequested(Message):
    """The user asked to compare runs `a` and `b` (None: pick them on the compare screen)."""

    a: Path | None = None
    b: Path | None = None


@dataclass
class RunLivenessSeen(Message):
    """A dashboard saw its run live (or no longer live); the app asks about live runs before quitting."""

    run_path: Path
    live: bool
